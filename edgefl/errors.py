"""How every ``edgefl`` command reports bad input: one line per problem on stderr, ``error: WHERE:
WHAT``, naming the flag or config key and what to do (pydantic's errors translated by
``edge_agent.problems``, click's usage errors flattened by ``edgefl.root.OneLineErrors``). Typer-free,
so that ``edgefl agent serve`` reports its errors without loading typer (``edgefl.cli``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import ValidationError

from edge_agent.problems import dotted, problem_lines

if TYPE_CHECKING:
    from rich.console import Console


class LazyConsole:
    """A rich ``Console`` made on first use, so that a command that never prints through one
    (``edgefl agent serve``: its output is logging) does not load rich (2 MB resident)."""

    def __init__(self, **options: Any):
        self._options = options
        self._console: Console | None = None

    @property
    def rich(self) -> Console:
        """The console itself (for rich objects that take one, as ``Live`` and ``Progress``)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rich, name)


def escape(markup: str) -> str:
    """``rich.markup.escape``, rich loaded when first needed."""
    from rich.markup import escape as escape_markup

    return escape_markup(markup)


stderr = LazyConsole(stderr=True, soft_wrap=True, highlight=False)


def say(message: str) -> None:
    """A plain line on stderr (progress and notices, so stdout stays the command's output)."""
    stderr.print(escape(message))


def fail(message: str, status: int = 2) -> NoReturn:
    """End the command with ``status``, one ``error:`` line on stderr per line of ``message``
    (``SystemExit``: click lets it through, and a command run without typer needs nothing more)."""
    for line in message.splitlines() or [""]:
        stderr.print(f"[bold red]error:[/] {escape(line)}")
    raise SystemExit(status)


@contextmanager
def reported(*errors: type[Exception], flags: Mapping[str, str]) -> Iterator[None]:
    """Ends the command on a ``ValidationError`` (one line per problem, named by ``flags``: config
    key -> the flag that sets it; a key no flag sets by its name; a check of several keys by its
    message alone, which names them) or on one of ``errors`` (its message)."""
    try:
        yield
    except ValidationError as err:
        fail("\n".join(problem_lines(err, None, lambda loc: _flag(loc, flags))))
    except errors as err:
        fail(str(err))


def _flag(loc: tuple[int | str, ...], flags: Mapping[str, str]) -> str:
    """The flag that sets ``loc``, the list or table holding it, or the one key of the table at
    ``loc`` that a flag sets (else the key itself)."""
    held = (flags.get(dotted(loc[:end])) for end in range(len(loc), 0, -1))
    inside = [flag for key, flag in flags.items() if loc and key.startswith(dotted(loc) + ".")]
    return next(filter(None, held), inside[0] if len(inside) == 1 else dotted(loc))


def flags_of(*names: str) -> dict[str, str]:
    """Parameter names -> their flags (``f_max`` -> ``--f-max``)."""
    return {name: "--" + name.replace("_", "-") for name in names}
