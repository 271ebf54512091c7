"""A gateway that lives on its own sensors (``[data] source = "sensors"``): readings stream from
its local broker into the store while the agent runs (``edge_agent.sensors``), and every round
trains on the latest history. Until the history holds enough for one training window the agent
stays unregistered, so no round waits for it."""

from __future__ import annotations

from edge_agent.config import AgentConfig
from edge_agent.data import SeriesTable
from edge_agent.learners import training_rows_needed
from edge_agent.sensors import SensorIngest
from edge_agent.serving.history import SensorHistory


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


class LiveHistory(SensorHistory):
    """The training agent's sensor history: none until it holds one training window."""

    def __init__(self, cfg: AgentConfig):
        super().__init__(cfg.live_gateway(), training_rows_needed(cfg))
