"""The ``edgefl`` command line (the console script, and ``python -m edgefl.cli``).

``edgefl agent serve``, the serving-only process of a gateway, runs here without loading typer,
click and the other commands' modules: they held 2.7 MB of its resident memory (bench/gateway.py).
Every other command line, and ``agent serve`` with ``--help`` or a mistake in its options, goes
to the typer app (``edgefl.commands``), which runs the same ``serve_agent``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from edgefl.service_run import CONFIG_FLAGS, serve_agent

SERVE = ("agent", "serve")
VERBOSE = {"--verbose": True, "--no-verbose": False}


def serve_options(args: Sequence[str]) -> tuple[Path, bool] | None:
    """``(config, verbose)`` where ``args`` are ``agent serve`` with only its config
    (``-c``/``--config PATH``, ``--config=PATH``) and ``--verbose``/``--no-verbose``, read as the
    typer command reads them (the last one given wins); None for any other command line."""
    if tuple(args[:len(SERVE)]) != SERVE:
        return None
    config, verbose, rest = None, False, list(args[len(SERVE):])
    while rest:
        arg = rest.pop(0)
        flag, equals, value = arg.partition("=")
        if arg in CONFIG_FLAGS and rest:
            config = rest.pop(0)
        elif equals and flag == CONFIG_FLAGS[0]:
            config = value
        elif arg in VERBOSE:
            verbose = VERBOSE[arg]
        else:
            return None
    return (Path(config), verbose) if config else None


def main() -> None:
    """Run the command line of ``sys.argv``."""
    options = serve_options(sys.argv[1:])
    if options is None:
        from edgefl.commands import app

        app()
    else:
        serve_agent(*options)


if __name__ == "__main__":
    main()
