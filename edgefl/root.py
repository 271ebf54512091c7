"""The ``edgefl`` command group: one-line usage errors, and commands built only when used where
building them imports torch (their options come from the model configs), so the services'
commands start without it."""

from __future__ import annotations

import functools
import importlib
import re
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from edgefl.errors import escape, stderr
from edgefl.extras import missing_extra

START, GATEWAY, COORDINATOR, EXPORT = "Getting started", "On a gateway", "Coordinator and sites", "Export and energy"
PANELS = (START, GATEWAY, COORDINATOR, EXPORT)
"""The panels of ``edgefl --help`` in order: the commands to try first, then one per role."""
LAZY = {"simulate": ("edgefl.simulate_cli", "coordinator"), "pretrain": ("edgefl.pretrain_cli", "coordinator")}
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
        """Every command, panel by panel in ``PANELS``' order."""
        names = [*super().list_commands(ctx), *LAZY]
        panel = {name: getattr(self.get_command(ctx, name), "rich_help_panel", None) for name in names}
        return sorted(names, key=lambda name: PANELS.index(panel[name]) if panel[name] in PANELS else len(PANELS))

    def get_command(self, ctx: Any, name: str) -> Any:
        command = self._command(ctx, name)
        return None if command is None else tidy_command(command)

    def _command(self, ctx: Any, name: str) -> Any:
        if name not in LAZY:
            return super().get_command(ctx, name)
        module, extra = LAZY[name]
        try:
            return typer.main.get_command(importlib.import_module(module).app)
        except ModuleNotFoundError as err:  # listed in --help; run, it names the extra to install
            return TyperCommand(name, help=f"(needs edgefl[{extra}])",
                                callback=functools.partial(missing_extra, err, extra),
                                context_settings={"ignore_unknown_options": True, "allow_extra_args": True})


def tidy(text: str | None) -> str | None:
    """A docstring as help text: lines of a paragraph joined (a docstring's breaks are not the
    terminal's), ``code`` as 'code', and square brackets kept (not rich markup)."""
    if not text:
        return text
    paragraphs = [" ".join(line.strip() for line in block.splitlines()) for block in text.strip().split("\n\n")]
    return escape("\n\n".join(re.sub(r"``([^`]+)``", r"'\1'", p) for p in paragraphs))


def tidy_command(command: Any) -> Any:
    """``command`` (and its subcommands and options) with every help text tidied, once."""
    if getattr(command, "_tidied", False):
        return command
    command.help, command.short_help = tidy(command.help), tidy(command.short_help)
    for param in command.params:
        if getattr(param, "help", None):
            param.help = tidy(param.help)
    for sub in getattr(command, "commands", {}).values():
        tidy_command(sub)
    command._tidied = True
    return command
