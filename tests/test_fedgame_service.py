"""Fed-GAME over a real mosquitto: quantile agents with private models upload, the coordinator
personalizes their final layer with the GAME aggregator and sends each its own difference; the
coordinator is killed mid-run and restarted, and every round still equals the simulation (which
holds only if the aggregator's trained parameters survived the restart)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch

from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.participation import recorded
from coordinator.store import Store
from coordinator.strategy_settings import GameSettings
from coordinator.strategies.fedgame import FedGAME
from edge_agent.learners.head import initial_shared_state
from edge_agent.models import ModelConfig
from tests.fleet import (
    MODEL, SEED, TRAINING, agent_config, coordinator_config, simulation_clients, start, wait_for, write_client_csvs,
)
from tests.test_service import assert_rounds_equal, finish, served_rounds, state

ROUNDS = 3
QUANTILE_MODEL = {**MODEL, "quantiles": [0.1, 0.5, 0.9]}
CLIENT = {"private_model": True, "prox_mu": 0.01}
GAME = {"steps": 10, "lr": 0.01}


def replay(db: Path, paths: list[Path]):
    """The in-process Fed-GAME federation of what the store recorded."""
    store = Store(db)
    try:
        happened = recorded(store, [f"client{i:02d}" for i in range(len(paths))])
    finally:
        store.close()
    fed = FederationConfig(rounds=ROUNDS, local_epochs=TRAINING["local_epochs"], batch_size=TRAINING["batch_size"],
                           lr=TRAINING["lr"], seed=SEED, test_every_round=False, strategy="fedgame",
                           game=GameSettings(**GAME), **CLIENT)
    return run_federation(simulation_clients(paths), ModelConfig(**QUANTILE_MODEL), fed, participation=happened)


def test_fedgame_coordinator_killed_mid_run_keeps_its_aggregator_and_equals_the_simulation(
    tmp_path: Path, mosquitto
) -> None:
    paths = write_client_csvs(tmp_path, 3)
    config = str(coordinator_config(tmp_path, mosquitto.port, ROUNDS, min_clients=3, strategy="fedgame", game=GAME,
                                    fleet_model={"model": QUANTILE_MODEL}))
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", config)
    agents = [start(tmp_path, f"agent{i}", "agent", "run", "-c",
                    str(agent_config(tmp_path, mosquitto.port, i, p, CLIENT, QUANTILE_MODEL)))
              for i, p in enumerate(paths)]
    db = tmp_path / "coordinator"
    wait_for(state(db, lambda s: s.latest_round() and len(s.updates(2)) >= 1), 180, "an update in round 2")
    os.kill(coordinator.pid, signal.SIGKILL)
    coordinator.wait(10)
    restarted = start(tmp_path, "coordinator-restarted", "coordinator", "serve", "-c", config)
    finish([restarted, *agents], timeout=240)
    assert restarted.returncode == 0, (tmp_path / "coordinator-restarted.log").read_text()

    store = Store(db)
    try:
        trained = store.strategy_state(1)
        messages = [store.personal_messages(r) for r in range(1, ROUNDS + 1)]
    finally:
        store.close()
    assert all(sorted(m) == ["client00", "client01", "client02"] for m in messages)
    untrained = FedGAME(initial_shared_state(ModelConfig(**QUANTILE_MODEL), SEED), GameSettings(**GAME), SEED)
    assert not torch.equal(trained["aggregator.encoder.weight"], untrained.state_dict()["aggregator.encoder.weight"])
    assert_rounds_equal(served_rounds(db), replay(db, paths).states)
