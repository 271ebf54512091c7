"""A coordinator with a real store and no broker, driven through its service loop's own methods
over a ``MemoryTransport``: messages are delivered, then taken in a turn, as the broker and
``Coordinator.serve`` would; what it published and acknowledged is read back from the transport."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator
from coordinator.store import RoundRow
from edge_agent.protocol import HelloHeader, UpdateHeader, encode
from edge_agent.toml_config import load_config
from edge_agent.topics import Topics
from edge_agent.transport import Incoming, MemoryTransport
from tests.fleet import coordinator_config

TOPICS = Topics("test")
DEADLINE_S = 20


def offline_coordinator(tmp_path: Path, rounds: int = 2, **overrides: object) -> Coordinator:
    """A coordinator with round 1 open and no broker; ``overrides``: more fields of its
    coordinator.toml (whose allow-list it reloads when the file changes, as the service does)."""
    config = coordinator_config(tmp_path, free_port(), rounds, **overrides)
    return resumed(load_config(config, CoordinatorConfig), config)


def resumed(cfg: CoordinatorConfig, config_path: Path | None = None) -> Coordinator:
    """A coordinator of ``cfg`` over a fresh ``MemoryTransport``, resumed as ``serve`` resumes it
    (a restart, where the state_dir already holds rounds)."""
    coordinator = Coordinator(cfg, config_path=config_path, transport=MemoryTransport())
    coordinator.resume()
    return coordinator


def transport_of(coordinator: Coordinator) -> MemoryTransport:
    """The in-memory transport of an offline coordinator: what it published and acknowledged."""
    assert isinstance(coordinator.transport, MemoryTransport)
    return coordinator.transport


def fed(coordinator: Coordinator, *messages: Incoming) -> bool:
    """``messages`` delivered together, then one turn of the service loop (whether it took a batch)."""
    transport_of(coordinator).deliver(*messages)
    return coordinator.turn()


def turn_until(done: Callable[[], bool], turn: Callable[[], object], what: str) -> None:
    """Service-loop ``turn``s until ``done()``, within ``DEADLINE_S``."""
    deadline = time.monotonic() + DEADLINE_S
    while not done() and time.monotonic() < deadline:
        turn()
    assert done(), f"{what} within {DEADLINE_S} s"


def closes(coordinator: Coordinator, number: int, timeout: float = 30.0) -> RoundRow:
    """Round ``number`` once the coordinator closes it (quorum + grace, from the updates' times)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        coordinator.close_if_due(coordinator.store.round(number))
        row = coordinator.store.round(number)
        if row.closed_at is not None:
            return row
    raise TimeoutError(f"round {number} did not close in {timeout} s")


def message(client: str, leaf: str, payload: bytes) -> Incoming:
    """A live QoS 1 message on ``client``'s ``leaf`` topic, as the broker hands it over."""
    return Incoming(TOPICS.agent(client, leaf), payload, 1, 1, False)


def hello_of(coordinator: Coordinator, client: str, n_features: int = 1) -> Incoming:
    """``client``'s hello with the fleet's model signature."""
    header = HelloHeader(fleet="test", sender=client, n_features=n_features, n_samples=50,
                         model_signature=coordinator.signature)
    return message(client, "hello", encode(header))


def update_of(coordinator: Coordinator, client: str, number: int = 1,
              params: dict[str, torch.Tensor] | None = None) -> Incoming:
    """``client``'s update of round ``number`` (default: the initial global state, unchanged)."""
    header = UpdateHeader(fleet="test", sender=client, round=number, n_samples=50, campaign=coordinator.campaign,
                          global_sha256=coordinator.announced_digest(number))
    return message(client, "update", encode(header, coordinator.initial if params is None else params))
