"""The ``edgefl`` command group: one-line usage errors, and commands built only when used where
building them imports torch (their options come from the model configs), so the services'
commands start without it."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from edgefl.errors import escape, stderr
from edgefl.extras import missing_extra

LAZY = {"simulate": ("edgefl.simulate_cli", "coordinator")}
"""Command name -> the module whose typer ``app`` holds it, and the extra that module needs."""


class OneLineErrors(TyperGroup):
    """The root command group: a usage error (unknown option, value of the wrong type) is one
    line too, instead of click's usage block and box."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            status = super().main(*args, standalone_mode=False, **kwargs)
        except typer.Abort:
            stderr.print("aborted")
            sys.exit(1)
        except typer.TyperException as err:
            message = err.format_message()
            if "\n" in message:  # a group called without a command: its help (rich printed it already: no message)
                err.show()
            elif message:
                stderr.print(f"[bold red]error:[/] {escape(message.replace('Value error, ', ''))}")
            sys.exit(getattr(err, "exit_code", 1))
        sys.exit(status if isinstance(status, int) else 0)


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
