"""The serving-only process of a live gateway (``edgefl agent serve``): it ingests the sensors
and publishes forecasts from the latest serving bundle on schedule, reloading the bundle when
the training agent (here, elsewhere or not yet) writes a new ``serving.json``. It reads only the
gateway's tables of ``agent.toml`` (``LiveGatewayConfig``) and never imports torch: its footprint
is ONNX Runtime, numpy, pydantic and paho (see ``bench/gateway.py``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from edge_agent.serving.history import SensorHistory
from edge_agent.serving.onnx_serving import INFO_FILE, OnnxServing
from edge_agent.toml_config import LiveGatewayConfig

log = logging.getLogger("edgefl.serve")
POLL_S = 1.0  # how often the loop checks for a new bundle, a due forecast and a stop
HEAVY_MODULES = ("torch", "pandas", "onnxruntime")


def heavy_modules() -> list[str]:
    """Which of the large libraries this process has loaded (torch must not be one)."""
    return [name for name in HEAVY_MODULES if name in sys.modules]


class ServeDaemon:
    """Sensor ingest plus scheduled forecasts from ``<state_dir>/serving``."""

    def __init__(self, gateway: LiveGatewayConfig):
        """Connects its sensor client as ``<client_id>-serve`` (its own MQTT session, so a training
        agent on the same broker keeps its own); both keep the readings in the same store."""
        if gateway.serving is None:
            raise ValueError("serving: agent.toml has no [serving] table; nothing to publish")
        self.gateway = gateway
        self.folder = Path(gateway.state_dir) / "serving"
        self.history = SensorHistory(gateway, mqtt_id=f"{gateway.client_id}-serve")
        self.server: OnnxServing | None = None
        self._seen: tuple[int, int] | None = None

    def reload(self) -> bool:
        """Load the bundle when ``serving.json`` changed since the last look; True when a new one
        is in use. A bundle that fails its checks is logged and the last good one kept."""
        try:
            stat = (self.folder / INFO_FILE).stat()
        except FileNotFoundError:
            return False
        if (stat.st_mtime_ns, stat.st_size) == self._seen:
            return False
        self._seen = (stat.st_mtime_ns, stat.st_size)
        try:
            server = OnnxServing(self.folder)
        except (OSError, ValueError) as err:
            log.warning("serving bundle in %s not loaded (%s); keeping the last one", self.folder, err)
            return False
        self.server = server
        log.info("serving the %s model of round %d from %s (loaded: %s)", server.info.model, server.info.round,
                 self.folder, ", ".join(heavy_modules()))
        try:
            self.history.announce(server)
        except Exception:  # discovery is a convenience: logged, tried again with the next bundle
            log.exception("Home Assistant discovery not published")
        return True

    def step(self) -> bool:
        """One turn of the loop: reload a new bundle and publish when due (at once after a reload);
        True when a forecast went out."""
        reloaded = self.reload()
        return self.history.publish_due(self.server, now=reloaded)

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Serve until ``stop`` says so; the sensor client is disconnected on the way out."""
        serving, client = self.gateway.serving, self.gateway.client_id
        if (self.folder / INFO_FILE).is_file():
            log.info("%s: serving forecasts on %s every %g s from %s", client, serving.forecast_topic(client),
                     serving.every_s, self.folder)
        else:
            log.warning("%s: waiting for a model bundle: none in %s yet (the training agent, edgefl agent run, "
                        "writes one after its first round); then forecasts go to %s every %g s", client, self.folder,
                        serving.forecast_topic(client), serving.every_s)
        self.history.start()
        try:
            while not stop():
                self.step()
                time.sleep(POLL_S)
        finally:
            self.history.stop()
