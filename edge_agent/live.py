"""A gateway that lives on its own sensors (``[data] source = "sensors"``): readings stream from
its local broker into the store while the agent runs (``edge_agent.sensors``), and every round
trains on the latest history. Until the history holds enough for one training window the agent
stays unregistered, so no round waits for it."""

from __future__ import annotations

import logging

from edge_agent.config import AgentConfig
from edge_agent.data import DataError, SeriesTable
from edge_agent.learners import training_rows_needed
from edge_agent.sensors import SensorIngest
from edge_agent.serving.home_assistant import discovery_messages
from edge_agent.serving.onnx_serving import OnnxServing, document

log = logging.getLogger("edgefl.agent")


def gateway_table(cfg: AgentConfig) -> SeriesTable:
    """The gateway's data as of now: its csv or bundled site, or its stored sensor readings on
    the model's step (what a live agent trains on)."""
    if cfg.data.source != "sensors":
        return cfg.data.load()
    ingest = SensorIngest(cfg.sensors, cfg.state_dir, cfg.client_id)
    try:
        return ingest.table(cfg.client_id, cfg.data.gaps)
    finally:
        ingest.stop()


class LiveHistory:
    """The agent's sensor ingest and the history it has gathered."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.ingest = SensorIngest(cfg.sensors, cfg.state_dir, cfg.client_id)
        self.needed = training_rows_needed(cfg)
        self._said = ""

    def start(self) -> None:
        self.ingest.start()

    def stop(self) -> None:
        self.ingest.stop()

    def table(self) -> SeriesTable | None:
        """The latest history, or None while it is too short to train on (said once per reason)."""
        try:
            table = self.ingest.table(self.cfg.client_id, self.cfg.data.gaps)
        except DataError as err:
            return self.waiting("no history", str(err))
        if table.n_rows < self.needed:
            return self.waiting("short history", f"{table.n_rows} intervals of sensor history; local training needs "
                                f"{self.needed}")
        return table

    def publish_forecast(self, server: OnnxServing) -> bool:
        """Forecast from the latest ``lookback`` intervals of history with the ONNX bundle and
        publish it on the ``[serving]`` topic; False (said once per reason) where the latest
        window has a gap or no history is there yet."""
        table = self.table()
        lookback = server.info.lookback
        if table is None or table.n_rows < lookback or not table.observed[-lookback:].all():
            self.waiting("no forecast", f"the latest {lookback} intervals of sensor history are not all there")
            return False
        payload = server.forecast(table.index[-lookback:].as_unit("ns").asi8, table.values[-lookback:])
        serving = self.cfg.serving
        self.ingest.publish(serving.forecast_topic(self.cfg.client_id), document(payload), serving.retain)
        return True

    def announce(self, server: OnnxServing) -> None:
        """With ``[serving] home_assistant``: the retained discovery configs of the forecast sensors."""
        serving = self.cfg.serving
        if serving.home_assistant:
            topic = serving.forecast_topic(self.cfg.client_id)
            for config_topic, payload in discovery_messages(server.info, topic, serving.discovery_prefix):
                self.ingest.publish(config_topic, payload, retain=True)

    def metrics(self) -> dict[str, float]:
        """Readings accepted and refused (by kind) over all features since the agent started, as
        ``sensor_<kind>`` update metrics the coordinator records."""
        totals: dict[str, float] = {}
        for counts in self.ingest.counts().values():
            for kind, count in counts.items():
                totals[f"sensor_{kind}"] = totals.get(f"sensor_{kind}", 0.0) + count
        return totals

    def waiting(self, reason: str, detail: str) -> None:
        """Say why the agent waits (for more history, or to forecast), once per ``reason``: it
        polls every few seconds and the details change with every reading."""
        if reason != self._said:
            log.info("%s: waiting (%s): %s", self.cfg.client_id, reason, detail)
            self._said = reason
        return None
