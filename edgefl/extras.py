"""Installs by role: the optional-dependency extra each CLI command needs (pyproject.toml), and the
one line a command prints instead of a traceback when a library of its extra is not installed."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import NoReturn, TypeVar

from edgefl.errors import fail

Command = TypeVar("Command", bound=Callable)
OWN_PACKAGES = frozenset({"edgefl", "edge_agent", "coordinator", "export", "hw_profiles"})
EXTRA_OF_MODULE = {"pvlib": "sites", "psycopg": "postgres", "atheris": "bench"}  # where not the command's own
MISSING_EXTRA_EXIT_CODE = 2


def missing_extra_line(extra: str, module: str) -> str:
    """What a command says (after ``error:``) when ``module`` (of ``extra``) is not installed."""
    return f"this command needs edgefl[{extra}] (no module named {module!r}): pip install 'edgefl[{extra}]'"


def missing_extra(err: ModuleNotFoundError, extra: str) -> NoReturn:
    """End the command with ``missing_extra_line`` for a library that is not installed (the extra of
    that library where it has its own, as pvlib's ``sites``); re-raise where one of ours is missing."""
    root = (err.name or "").partition(".")[0]
    if not root or root in OWN_PACKAGES:
        raise err
    fail(missing_extra_line(EXTRA_OF_MODULE.get(root, extra), root), MISSING_EXTRA_EXIT_CODE)


def needs(extra: str) -> Callable[[Command], Command]:
    """Mark a command as part of ``extra``: a library it imports that is not installed ends it with
    ``missing_extra``."""

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def run(*args: object, **kwargs: object) -> object:
            try:
                return command(*args, **kwargs)
            except ModuleNotFoundError as err:
                missing_extra(err, extra)

        return run  # type: ignore[return-value]

    return decorate


def require_installed(*modules: str) -> None:
    """Raise ``ModuleNotFoundError`` (for ``needs``) for the first of ``modules`` that is not
    installed, without importing any: what a command's child processes will import."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
