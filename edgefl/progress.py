"""Progress as a person reads it: rounds as a live table on a terminal; piped or logged, one plain
line per round as it ends (a live table would show only at the end, cut to 80 columns), shared by
``edgefl simulate`` and ``edgefl demo``; and a heartbeat line every 10 s of a long stage."""

from __future__ import annotations

import threading
import time
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



@contextmanager
def heartbeat(say: Callable[[str], None], what: str, every_s: float = 10.0) -> Iterator[None]:
    """While the block runs, ``say`` "<what>: still working (N s)" every ``every_s`` seconds, so a
    long stage is never silent, piped or on a terminal."""
    done, started = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every_s):
            say(f"{what}: still working ({time.monotonic() - started:.0f} s)")

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
