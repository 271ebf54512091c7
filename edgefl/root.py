"""The ``edgefl`` command group: one-line usage errors, and commands built only when used where
building them imports torch (their options come from the model configs), so the services'
commands (``agent serve`` on a gateway) start without it."""

from __future__ import annotations

import importlib
from typing import Any

import typer

from edgefl.errors import OneLineErrors

LAZY = {"simulate": "edgefl.simulate_cli"}
"""Command name -> the module whose typer ``app`` holds it."""


class RootGroup(OneLineErrors):
    """``edgefl``'s group: the registered commands plus ``LAZY``."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *LAZY]

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in LAZY:
            return super().get_command(ctx, name)
        return typer.main.get_command(importlib.import_module(LAZY[name]).app)
