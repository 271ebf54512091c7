"""``edgefl agent forecast``'s output: a table per group of features that fits the terminal (at
80 columns no value is cut), or CSV."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgefl.errors import escape

if TYPE_CHECKING:
    from edge_agent.forecast import Forecast

TIME_WIDTH = len("2026-01-01 00:00:00") + 4  # the time column with its borders
BORDERS = 3  # a column's padding and rule


def column_groups(widths: list[int], room: int) -> list[list[int]]:
    """Consecutive groups of column indices whose widths (each plus its borders) fit ``room``;
    a column wider than ``room`` gets a group of its own."""
    groups: list[list[int]] = []
    used = room
    for index, width in enumerate(widths):
        if used + width + BORDERS > room and (not groups or groups[-1]):
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += width + BORDERS
    return groups


def print_forecast(client_id: str, result: Forecast, width: int) -> None:
    """The forecast as tables of ``width`` columns at most: time, then each feature's cells."""
    from rich.console import Console
    from rich.table import Table

    cells = [result.cells(step) for step in range(len(result.stamps))]
    widths = [max(len(name), *(len(row[j]) for row in cells)) for j, name in enumerate(result.columns)]
    caption = escape(f"median [q{result.levels[0]:g}, q{result.levels[-1]:g}]") if result.levels else None
    console = Console(width=width)
    for group in column_groups(widths, width - TIME_WIDTH):
        table = Table(title=f"{client_id}: next {len(result.stamps)} steps", caption=caption)
        table.add_column("time", no_wrap=True)
        for j in group:
            table.add_column(result.columns[j], justify="right", no_wrap=True)
        for stamp, row in zip(result.stamps, cells):
            table.add_row(stamp, *(escape(row[j]) for j in group))
        console.print(table)
