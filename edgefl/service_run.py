"""What a long-running ``edgefl`` service needs to run, without typer: its logging, its stop on
SIGTERM/SIGINT, and the whole of ``edgefl agent serve``, which the console script runs without
loading typer (``edgefl.cli``) and the typer app runs for ``--help`` and mistakes
(``edgefl.services``)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

from edgefl.errors import fail
from edgefl.extras import needs

CONFIG_FLAGS = ("--config", "-c")


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )


class Stopper:
    """Turns SIGTERM/SIGINT into a clean stop of the service loop."""

    def __init__(self) -> None:
        self.stopped = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, *_: object) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped


@needs("serve")
def serve_agent(config: Path, verbose: bool) -> None:
    """``edgefl agent serve``: the serving-only process of a gateway, until SIGTERM/SIGINT."""
    from edge_agent.serving.daemon import ServeDaemon
    from edge_agent.storage import StateDirError
    from edge_agent.toml_config import ConfigError, LiveGatewayConfig, load_config

    setup_logging(verbose)
    try:
        daemon = ServeDaemon(load_config(config, LiveGatewayConfig))
    except (ConfigError, ValueError, StateDirError) as err:
        fail(str(err))
    daemon.run(stop=Stopper())
