"""A live gateway's sensor history and the one path that publishes its forecasts, shared by the
training agent (``edge_agent.live.LiveHistory``) and the serving-only process
(``edge_agent.serving.daemon``); torch-free, so the latter never loads it."""

from __future__ import annotations

import logging
import time

from edge_agent.data.errors import DataError
from edge_agent.sensors.ingest import SensorIngest
from edge_agent.serving.freshness import FRESH, Freshness, freshness
from edge_agent.serving.home_assistant import discovery_messages
from edge_agent.serving.onnx_serving import OnnxServing, document
from edge_agent.times import now_ns
from edge_agent.toml_config import LiveGatewayConfig

log = logging.getLogger("edgefl.agent")


class SensorHistory:
    """The gateway's sensor ingest and the history it has gathered."""

    def __init__(self, gateway: LiveGatewayConfig, needed: int = 1, mqtt_id: str | None = None):
        """``needed``: rows of history before ``rows`` counts them (what training needs);
        ``mqtt_id``: the name the sensor client connects as (default the gateway's ``client_id``)."""
        self.gateway = gateway
        self.ingest = SensorIngest(gateway.sensors, gateway.state_dir, mqtt_id or gateway.client_id)
        self.needed = needed
        self._said = ""
        self._next_forecast = 0.0
        self._told: str | None = None  # the freshness state last published

    def start(self) -> None:
        self.ingest.start()

    def stop(self) -> None:
        self.ingest.stop()

    def rows(self) -> int | None:
        """The intervals of the latest history, or None while it is too short to train on (said
        once per reason); numpy only, as the table a child builds on it would refuse it."""
        try:
            rows = self.ingest.rows(self.gateway.client_id, self.gateway.data.gaps)
        except DataError as err:
            return self.waiting("no history", str(err))
        if rows < self.needed:
            return self.waiting("short history", f"{rows} intervals of sensor history; local training needs "
                                f"{self.needed}")
        return rows

    def publish_due(self, server: OnnxServing | None, now: bool = False) -> bool:
        """Publish a forecast with ``server`` when one is due (every ``[serving] every_s``, or
        ``now``: after a new model); True when one went out. Never raises: a forecast is never
        worth the process, so a failed one is logged and retried on schedule."""
        if server is None or (not now and time.monotonic() < self._next_forecast):
            return False
        self._next_forecast = time.monotonic() + self.gateway.serving.every_s
        try:
            return self.publish_forecast(server)
        except Exception:  # the guard's purpose: logged, retried on schedule
            log.exception("forecast not published")
            return False

    def publish_forecast(self, server: OnnxServing) -> bool:
        """Forecast from the latest ``lookback`` intervals of history with the ONNX bundle and
        publish it on the ``[serving]`` topic; False (said once per reason) where the latest
        window has a gap or no history is there yet, and where the readings are stale (then the
        stale state goes out instead). numpy only: the serving process has no pandas."""
        lookback, gateway = server.info.lookback, self.gateway
        current = self.freshness()
        if current is not None and current.state != FRESH:
            self.tell(current)
            return False
        try:
            window = self.ingest.window(gateway.client_id, lookback, gateway.data.gaps)
        except DataError as err:
            window = self.waiting("no history", str(err))
        if window is None:
            self.waiting("no forecast", f"the latest {lookback} intervals of sensor history are not all there")
            return False
        payload = server.forecast(*window)
        serving, client_id = self.gateway.serving, self.gateway.client_id
        self.ingest.publish(serving.forecast_topic(client_id), document(payload), serving.retain)
        if current is not None:
            self.tell(current)
        return True

    def freshness(self) -> Freshness | None:
        """How old the newest reading of the least recent configured feature is, now."""
        sensors = self.gateway.sensors
        latest = {feature.name: self.ingest.store.latest(feature.name) for feature in sensors.features}
        return freshness(latest, now_ns(), self.gateway.serving.stale_after_ns(sensors.step_ns))

    def tell(self, current: Freshness) -> None:
        """Publish the freshness state (retained) when it changed, and log each change to stale
        and back once, naming the sensor and its age."""
        if current.state == self._told:
            return
        serving, client_id = self.gateway.serving, self.gateway.client_id
        self.ingest.publish(serving.freshness_topic(client_id), current.document(), retain=True)
        if current.state != FRESH:
            log.warning("%s: forecasts withheld, readings are stale: %s; %s says stale until readings return",
                        client_id, current.describe(), serving.freshness_topic(client_id))
        elif self._told is not None:
            log.info("%s: readings are current again (%s); forecasts resume", client_id, current.describe())
        self._told = current.state

    def metrics(self) -> dict[str, float]:
        """Readings accepted and refused (by kind) over all features since the agent started, as
        ``sensor_<kind>`` update metrics the coordinator records."""
        totals: dict[str, float] = {}
        for counts in self.ingest.counts().values():
            for kind, count in counts.items():
                totals[f"sensor_{kind}"] = totals.get(f"sensor_{kind}", 0.0) + count
        return totals

    def announce(self, server: OnnxServing) -> None:
        """With ``[serving] home_assistant``: the retained discovery configs of the forecast sensors."""
        serving = self.gateway.serving
        if serving.home_assistant:
            topic = serving.forecast_topic(self.gateway.client_id)
            availability = (self.ingest.status_topic, serving.freshness_topic(self.gateway.client_id))
            for config_topic, payload in discovery_messages(server.info, topic, serving.discovery_prefix,
                                                            self.gateway.sensors.features, availability,
                                                            serving.home_assistant_steps, serving.every_s):
                self.ingest.publish(config_topic, payload, retain=True)

    def waiting(self, reason: str, detail: str) -> None:
        """Say why the gateway waits (for more history, or to forecast), once per ``reason``: it
        polls every few seconds and the details change with every reading."""
        if reason != self._said:
            log.info("%s: waiting (%s): %s", self.gateway.client_id, reason, detail)
            self._said = reason
        return None
