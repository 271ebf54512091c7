"""Rounds as a person reads them: a live table on a terminal; piped or logged, one plain line per
round as it ends (a live table would show only at the end, cut to 80 columns). Shared by
``edgefl simulate`` and ``edgefl demo``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from rich.console import Console
from rich.live import Live
from rich.table import Table


@contextmanager
def live_rounds(console: Console, table: Table) -> Iterator[Callable[[list[str]], None]]:
    """Show ``table`` live on a terminal while the block runs; yields the function that adds a
    round's cells (and, off a terminal, prints them as one "header value; ..." line)."""

    def show(cells: list[str]) -> None:
        table.add_row(*cells)
        if not console.is_terminal:
            print("; ".join(f"{column.header} {cell}" for column, cell in zip(table.columns, cells)), flush=True)

    with Live(table, console=console, refresh_per_second=4) if console.is_terminal else nullcontext():
        yield show

