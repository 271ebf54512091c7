"""The service loops themselves over an in-memory broker: a real coordinator (``serve``) and two
real agents (``run``, training in their child processes) in one process, connected by a
``MemoryBroker`` instead of mosquitto. Every round's global state equals the in-process
simulation of what happened, as over a real broker (tests/test_service.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator, coordinator_subscriptions
from edge_agent.agent import Agent, agent_subscriptions
from edge_agent.config import AgentConfig
from edge_agent.toml_config import load_config
from edge_agent.transport import MemoryBroker
from tests.fleet import agent_config, coordinator_config, write_client_csvs
from tests.test_service import assert_rounds_equal, replay, served_rounds

ROUNDS, DEADLINE_S = 2, 300


def test_a_coordinator_and_two_agents_over_an_in_memory_broker_equal_the_simulation(tmp_path: Path) -> None:
    paths, broker, port = write_client_csvs(tmp_path, 2), MemoryBroker(), free_port()
    config = coordinator_config(tmp_path, port, ROUNDS, start_clients=2, min_clients=2)
    fleet = load_config(config, CoordinatorConfig)
    coordinator = Coordinator(fleet, config_path=config, transport=broker.session(*coordinator_subscriptions(fleet)))
    agents = []
    for index, csv in enumerate(paths):
        cfg = load_config(agent_config(tmp_path, port, index, csv), AgentConfig)
        agents.append(Agent(cfg, transport=broker.session(*agent_subscriptions(cfg))))
    deadline = time.monotonic() + DEADLINE_S
    running = [threading.Thread(target=agent.run, kwargs={"stop": lambda: time.monotonic() > deadline}, daemon=True)
               for agent in agents]
    for thread in running:
        thread.start()
    coordinator.serve(stop=lambda: time.monotonic() > deadline)
    for thread in running:
        thread.join(max(deadline - time.monotonic(), 1))
    assert time.monotonic() < deadline and not any(thread.is_alive() for thread in running)
    assert all(agent.finished for agent in agents) and broker.retained[coordinator.topics.coordinator_status] == b"offline"

    db = tmp_path / "coordinator"
    assert_rounds_equal(served_rounds(db), replay(db, paths, ROUNDS).states)
