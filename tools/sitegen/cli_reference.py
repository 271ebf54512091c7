"""The command-line reference, generated from the typer app (``edgefl.commands.app``) with typer's own
markdown renderer, so every command and option on the page is the one the program accepts."""

from __future__ import annotations

import typer
import typer.main
from typer.cli import get_docs_for_click
from typer.core import TyperCommand, TyperGroup


def command_tree() -> TyperGroup:
    """The command tree behind ``edgefl`` (imported here: the CLI pulls in torch), the commands
    it builds only when used (``edgefl.root.LAZY``) built and added."""
    from edgefl.commands import app

    tree = typer.main.get_command(app)
    with typer.Context(tree, info_name="edgefl") as context:
        for name in tree.list_commands(context):
            tree.commands.setdefault(name, tree.get_command(context, name))
    return tree


def command_paths(command: TyperCommand | TyperGroup, prefix: str = "edgefl") -> list[str]:
    """Every command line the tree accepts, e.g. ``edgefl coordinator serve``, depth first."""
    paths = [prefix]
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            if not sub.hidden:
                paths += command_paths(sub, f"{prefix} {name}")
    return paths


def render(command: TyperCommand | TyperGroup | None = None) -> str:
    """The whole reference page: usage, arguments and options of every command."""
    command = command if command is not None else command_tree()
    with typer.Context(command, info_name="edgefl") as context:
        body = get_docs_for_click(obj=command, ctx=context, name="edgefl", title="Command-line reference")
    note = ("Generated from the typer app at every build of this site (`tools/sitegen/cli_reference.py`); "
            "`edgefl COMMAND --help` prints the same.\n\n")
    title, _, rest = body.partition("\n\n")
    return f"{title}\n\n{note}{escaped_tags(rest)}"


def escaped_tags(markdown: str) -> str:
    """Help texts such as ``<prefix>/<device>`` shown as text, not swallowed as HTML tags: ``<``
    is escaped outside code spans and fenced blocks."""
    lines, fenced = [], False
    for line in markdown.split("\n"):
        fenced = fenced != line.startswith("```")
        if not fenced and not line.startswith("```"):
            parts = line.split("`")
            line = "`".join(part.replace("<", "&lt;") if i % 2 == 0 else part for i, part in enumerate(parts))
        lines.append(line)
    return "\n".join(lines)
