"""A gateway that lives on its own sensors (``[data] source = "sensors"``): readings stream from
its local broker into the store while the agent runs (``edge_agent.sensors``), and every round
trains on the latest history. Until the history holds enough for one training window the agent
stays unregistered, so no round waits for it. Torch-free: the process that prepares a round's
data (``edge_agent.round_data``) reads the gateway's table here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from edge_agent.sensors.ingest import SensorIngest
from edge_agent.sensors.settings import SensorSettings
from edge_agent.serving.history import SensorHistory
from edge_agent.rows_needed import training_rows_needed
from edge_agent.toml_config import DataSource

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig
    from edge_agent.data import SeriesTable


class DataSide(Protocol):
    """What a gateway's table is read from: ``AgentConfig`` and ``edge_agent.round_data.DataJob``."""

    client_id: str
    state_dir: Path
    data: DataSource
    sensors: SensorSettings | None


def gateway_table(cfg: DataSide) -> SeriesTable:
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
