"""The tutorials' runnable commands: a fenced block right after ``<!-- run -->`` is run by the test
suite, and a fenced block right after ``<!-- output -->`` that follows it lists key lines the
command must print, so a page's commands and shown output cannot drift from the program."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

RUN, OUTPUT, ELISION = "<!-- run -->", "<!-- output -->", "..."
FENCE = re.compile(r"^```")


@dataclass(frozen=True)
class Runnable:
    """One marked command block of a page, with the lines its output must contain."""

    page: str
    line: int
    command: str
    expected: tuple[str, ...]


def fenced_block(lines: list[str], start: int, page: str) -> tuple[list[str], int]:
    """The body of the fenced block that opens at the first non-blank line from ``start``, and
    the index after its closing fence; a marker without a block is an error naming the line."""
    index = start
    while index < len(lines) and not lines[index].strip():
        index += 1
    if index >= len(lines) or not FENCE.match(lines[index]):
        raise ValueError(f"{page}:{start}: a run/output marker must be followed by a fenced block")
    end = index + 1
    while end < len(lines) and not FENCE.match(lines[end]):
        end += 1
    if end >= len(lines):
        raise ValueError(f"{page}:{index + 1}: fenced block never closed")
    return lines[index + 1:end], end + 1


def runnables(text: str, page: str = "<page>") -> list[Runnable]:
    """Every marked command of a page, in page order."""
    lines, found, index = text.split("\n"), [], 0
    while index < len(lines):
        if lines[index].strip() == OUTPUT:
            raise ValueError(f"{page}:{index + 1}: an output block must follow a run block")
        if lines[index].strip() != RUN:
            index += 1
            continue
        marker = index + 1
        command, index = fenced_block(lines, index + 1, page)
        expected: list[str] = []
        after = index
        while after < len(lines) and not lines[after].strip():
            after += 1
        if after < len(lines) and lines[after].strip() == OUTPUT:
            expected, index = fenced_block(lines, after + 1, page)
        found.append(Runnable(page, marker, "\n".join(command),
                              tuple(line for line in expected if line.strip() and line.strip() != ELISION)))
    return found


def normalized(line: str) -> str:
    """A line with each run of whitespace as one space, so table padding does not matter."""
    return " ".join(line.split())


def shows(expected: str, printed: str) -> bool:
    """Whether one printed line shows an expected line: its parts between ``...`` in order."""
    position = 0
    for part in (normalized(p) for p in normalized(expected).split(ELISION)):
        found = printed.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return True


def missing(expected: tuple[str, ...], output: str) -> list[str]:
    """The expected lines no printed line shows."""
    printed = [normalized(line) for line in output.splitlines()]
    return [line for line in expected if not any(shows(line, p) for p in printed)]


def pages(docs: Path) -> dict[str, list[Runnable]]:
    """The pages of ``docs`` that hold marked commands, by path relative to it."""
    found = {}
    for path in sorted(docs.rglob("*.md")):
        marked = runnables(path.read_text(), str(path.relative_to(docs)))
        if marked:
            found[str(path.relative_to(docs))] = marked
    return found
