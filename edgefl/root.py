"""The ``edgefl`` command group: one-line usage errors, and commands built only when used where
building them imports torch (their options come from the model configs), so the services'
commands (``agent serve`` on a gateway) start without it."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import typer
from typer.core import TyperCommand

from edgefl.errors import OneLineErrors, escape
from edgefl.extras import missing_extra

LAZY = {"simulate": ("edgefl.simulate_cli", "coordinator")}
"""Command name -> the module whose typer ``app`` holds it, and the extra that module needs."""


class RootGroup(OneLineErrors):
    """``edgefl``'s group: the registered commands plus ``LAZY``."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *LAZY]

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in LAZY:
            return super().get_command(ctx, name)
        module, extra = LAZY[name]
        try:
            return typer.main.get_command(importlib.import_module(module).app)
        except ModuleNotFoundError as err:  # listed in --help; run, it names the extra to install
            return TyperCommand(name, help=escape(f"(needs edgefl[{extra}])"),
                                callback=functools.partial(missing_extra, err, extra),
                                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
