"""A fleet's MQTT topic names: torch-free, so that the setup commands (``init``, ``broker-config``)
check a fleet name without loading the wire protocol's tensor side (``edge_agent.protocol``)."""

from __future__ import annotations

import re
from typing import Literal

from edge_agent.limits import NAME_PATTERN


class Topics:
    """Every topic of one fleet, under ``edgefl/<fleet>/``; on a site broker the central broker's
    topics appear under ``under`` (e.g. ``uplink/``, remapped by the mosquitto bridge)."""

    def __init__(self, fleet: str, under: str = ""):
        if not re.match(NAME_PATTERN, fleet):
            raise ValueError(f"fleet name {fleet!r} must match {NAME_PATTERN}")
        self.root = f"{under}edgefl/{fleet}"

    def agent(self, client_id: str, leaf: Literal["hello", "status", "update", "task"]) -> str:
        return f"{self.root}/agents/{client_id}/{leaf}"

    def agents(self, leaf: Literal["hello", "status", "update"]) -> str:
        """Wildcard subscription over every agent's ``leaf`` topic."""
        return f"{self.root}/agents/+/{leaf}"

    @property
    def round(self) -> str:
        return f"{self.root}/round"

    @property
    def coordinator_status(self) -> str:
        return f"{self.root}/coordinator/status"

    def client_of(self, topic: str) -> str | None:
        """The client id in an ``agents/<id>/...`` topic of this fleet, else None."""
        parts = topic.removeprefix(f"{self.root}/agents/").split("/")
        return parts[0] if len(parts) == 2 and topic.startswith(f"{self.root}/agents/") else None
