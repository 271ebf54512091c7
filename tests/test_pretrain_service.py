"""FeDaL pretraining as a service: agents in pretrain mode upload the model plus their core-sets
through a real mosquitto, the coordinator runs FeDaL's server side, survives a kill mid-run with
its drift state, refuses bad core-sets by name and writes the pretrained foundation checkpoint."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest
import torch

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig
from coordinator.pretraining import FOUNDATION_FILE
from coordinator.server import FINISHED_EXIT_CODE, Coordinator
from coordinator.simulation.participation import recorded
from coordinator.simulation.pretrain import pretrain
from coordinator.simulation.pretrain_config import PretrainConfig
from coordinator.store import Store
from coordinator.strategy_settings import GBESettings
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.data import load_site
from edge_agent.data.canonical import device_series
from edge_agent.learners import fleet_template, make_learner
from edge_agent.models.fedal_settings import FedalClientSettings
from edge_agent.models.foundation import load_foundation
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.protocol import UpdateHeader, encode
from edge_agent.tensors import layout_of, named_layout
from edge_agent.transport import Incoming
from tests.fleet import SEED, coordinator_config, start, wait_for
from tests.offline import fed, hello_of, message, resumed
from tests.test_service import finish, served_rounds, state

SITES = ("amsterdam", "miami", "greensboro")
ROUNDS = 2
FOUNDATION = {"window": 12, "d_model": 16, "heads": 2, "layers": 1, "d_ff": 32, "dropout": 0.0}
DEVICE_SIDE = {"coreset": {"size": 2, "steps": 2}}
SERVER = {"tune_steps": 2, "tune_batch": 8}
TRAINING = {"local_epochs": 1, "batch_size": 64, "lr": 0.003, "stride": 48}
FLEET = {"mode": "pretrain", "foundation_model": FOUNDATION, "fedal_client": DEVICE_SIDE}


def pretrain_coordinator(folder: Path, port: int, **overrides: object) -> Path:
    return coordinator_config(folder, port, ROUNDS, fleet_model=FLEET, fedal=SERVER, **overrides)


def pretrain_agent(folder: Path, port: int, index: int, fleet: dict = FLEET) -> Path:
    path = folder / f"agent{index}.toml"
    path.write_text(dump_toml({
        **fleet, "fleet": "test", "client_id": f"client{index:02d}", "state_dir": str(folder / f"agent{index}"),
        "seed": SEED, "client_index": index, "data": {"site": SITES[index]}, "training": TRAINING,
        "broker": {"port": port, "keepalive_s": 5},
    }))
    return path


def simulated_rounds(db: Path) -> list[dict[str, torch.Tensor]]:
    """coordinator/simulation's FeDaL pretraining of the same devices with the same settings and
    seeds, with the participation the coordinator's store recorded: the global state per round."""
    store = Store(db)
    try:
        happened = recorded(store, [f"client{i:02d}" for i in range(len(SITES))])
    finally:
        store.close()
    fm = FoundationConfig(**FOUNDATION)
    cfg = PretrainConfig(rounds=ROUNDS, seed=SEED, strategy="fedal", client=FedalClientSettings(**DEVICE_SIDE),
                         server=GBESettings(**SERVER), **TRAINING)
    devices = [device_series(dataclasses.replace(load_site(site), name=f"client{i:02d}"), fm.variables, fm.window,
                             TRAINING["stride"]) for i, site in enumerate(SITES)]
    _, rounds = pretrain(devices, fm, cfg, participation=happened)
    return [r.global_state for r in rounds]


def assert_bit_identical(served: list[dict[str, torch.Tensor]], simulated: list[dict[str, torch.Tensor]]) -> None:
    assert len(served) == len(simulated) == ROUNDS
    for number, (mine, theirs) in enumerate(zip(served, simulated), 1):
        assert mine.keys() == theirs.keys(), f"round {number}"
        different = [name for name in mine if not torch.equal(mine[name], theirs[name])]
        assert not different, f"round {number}: {different} differ from the simulation"


def test_fedal_pretraining_killed_mid_run_resumes_with_its_drift_and_equals_the_simulation(
    tmp_path: Path, mosquitto
) -> None:
    """Three FeDaL devices over mosquitto; the coordinator is killed once round 2 has an update,
    so the restarted one must resume with round 1's drift state: every round's global state is
    bit-identical to coordinator/simulation's, and the last one is the foundation checkpoint."""
    config = str(pretrain_coordinator(tmp_path, mosquitto.port, min_clients=3, start_clients=3))
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", config)
    agents = [start(tmp_path, f"agent{i}", "agent", "run", "-c", str(pretrain_agent(tmp_path, mosquitto.port, i)))
              for i in range(len(SITES))]
    db = tmp_path / "coordinator"
    wait_for(state(db, lambda s: s.latest_round() and len(s.updates(2)) >= 1), 240, "an update in round 2")
    os.kill(coordinator.pid, signal.SIGKILL)
    coordinator.wait(10)
    drift = Store(db).strategy_state(1)
    assert drift and float(sum(t.abs().sum() for t in drift.values())) > 0, "round 1 left no drift state"
    restarted = start(tmp_path, "coordinator-restarted", "coordinator", "serve", "-c", config)
    finish([restarted, *agents], 240)
    output = (tmp_path / "coordinator-restarted.log").read_text()
    # 0: it closed round 2; FINISHED_EXIT_CODE: the kill came after the last close (it announced the end again)
    assert restarted.returncode in (0, FINISHED_EXIT_CODE), output
    for i in range(len(SITES)):
        assert (tmp_path / f"agent{i}.log").read_text().count("update sent") == ROUNDS
    served = served_rounds(db)
    assert_bit_identical(served, simulated_rounds(db))
    store = Store(db)
    try:
        update = store.load_update(store.updates(1)[0])
    finally:
        store.close()
    assert update["coreset.windows"].shape == (2, FOUNDATION["window"], 9)
    checkpoint = load_foundation(db / FOUNDATION_FILE)
    assert all(torch.equal(v, served[-1][k]) for k, v in checkpoint.state_dict().items())
    assert f"round {ROUNDS}: foundation checkpoint {db / FOUNDATION_FILE} (sha256 " in output


def upload(coordinator: Coordinator, client: str, windows: torch.Tensor, number: int = 1) -> Incoming:
    """``client``'s update for round ``number``: the initial model moved by 0.01 (a drift) and a
    core-set of ``windows``."""
    model = {k: v + 0.01 for k, v in coordinator.initial.items()}
    tensors = {**model, "coreset.windows": windows, "coreset.present": torch.ones(9)}
    header = UpdateHeader(fleet="test", sender=client, round=number, n_samples=50, campaign=coordinator.campaign,
                          global_sha256=coordinator.announced_digest(number))
    return message(client, "update", encode(header, tensors))


@pytest.mark.parametrize("windows, code", [(torch.zeros(3, 12, 9), "bad_tensors"),
                                           (torch.full((2, 12, 9), float("nan")), "not_finite")])
def test_a_bad_coreset_is_refused_by_name_and_the_round_closes_with_the_drift_kept(
    tmp_path: Path, windows: torch.Tensor, code: str
) -> None:
    """b's core-set has the wrong shape or NaNs: refused with its code, naming the tensor; the
    round closes on a's update, FeDaL's drift state is stored and a restarted coordinator
    resumes with it; the foundation checkpoint holds the new global model."""
    coordinator = resumed(load_config(pretrain_coordinator(tmp_path, free_port()), CoordinatorConfig))
    fed(coordinator, *(hello_of(coordinator, c, n_features=9) for c in ("a", "b")))
    fed(coordinator, upload(coordinator, "b", windows), upload(coordinator, "a", torch.randn(2, 12, 9)))
    refused = coordinator.store.events(accepted=False)
    assert [(e["client_id"], e["code"]) for e in refused] == [("b", code)] and "coreset.windows" in refused[0]["reason"]
    fed(coordinator, message("b", "status", b"offline"))
    assert coordinator.close_if_due(coordinator.store.round(1)).round == 2
    closed = coordinator.store.round(1)
    assert closed.metrics["clients"] == ["a"] and closed.metrics["coresets"] == 1.0
    drift = coordinator.strategy.state_dict()
    assert float(sum(t.abs().sum() for t in drift.values())) > 0
    checkpoint = load_foundation(tmp_path / "coordinator" / FOUNDATION_FILE)
    after = coordinator.store.load_file(closed.result_file)
    assert all(torch.equal(v, after[k]) for k, v in checkpoint.state_dict().items())
    coordinator.store.close()
    restarted = resumed(coordinator.cfg)
    assert all(torch.equal(restarted.strategy.state_dict()[k], v) for k, v in drift.items())
    restarted.store.close()


def test_after_a_restart_a_late_update_feeds_its_twin_the_model_without_the_coreset(tmp_path: Path) -> None:
    """b misses round 2 (imputed by its stale twin); its update arrives after a restart, before
    the restarted coordinator closes any round: the twin keeps the model part, not the core-set."""
    cfg = load_config(pretrain_coordinator(tmp_path, free_port(), twin="stale"), CoordinatorConfig)
    coordinator = resumed(cfg)
    fed(coordinator, *(hello_of(coordinator, c, n_features=9) for c in ("a", "b")))
    coreset = torch.randn(2, 12, 9)
    fed(coordinator, upload(coordinator, "a", coreset), upload(coordinator, "b", coreset))
    assert coordinator.close_if_due(coordinator.store.round(1)).round == 2
    fed(coordinator, message("b", "status", b"offline"), upload(coordinator, "a", coreset, 2))
    assert coordinator.close_if_due(coordinator.store.round(2)).closed_at is not None
    assert coordinator.store.round(2).metrics["imputed"] == ["b"]
    coordinator.store.close()
    restarted = resumed(cfg)
    fed(restarted, upload(restarted, "b", coreset, 2))
    assert [e["code"] for e in restarted.store.events(accepted=True) if e["client_id"] == "b"][-1] == "late"
    assert restarted.engine.history.last_round("b") == 2
    assert restarted.engine.history.history("b")[-1].keys() == restarted.initial.keys()
    restarted.store.close()


def test_pretrain_mode_picks_and_checks_its_strategy(tmp_path: Path) -> None:
    base = {"fleet": "test", "state_dir": str(tmp_path), **FLEET}
    fedal = CoordinatorConfig(**base)
    assert fedal.strategy == "fedal" and fedal.fedal.model == FoundationConfig(**FOUNDATION)
    plain = {k: v for k, v in base.items() if k != "fedal_client"}
    assert CoordinatorConfig(**plain).strategy == "fedavg"
    with pytest.raises(ValueError, match="strategy 'fedal' tunes on the devices' core-sets"):
        CoordinatorConfig(**plain, strategy="fedal")
    with pytest.raises(ValueError, match="fedal.model differs from foundation_model"):
        CoordinatorConfig(**base, fedal={"model": {"window": 24}})
    with pytest.raises(ValueError, match="fedal.patch = 3 differs from fedal_client.patch = 4"):
        CoordinatorConfig(**{**base, "fedal_client": {**DEVICE_SIDE, "patch": 4}})
    with pytest.raises(ValueError, match="only strategy 'fedal' uses, not 'fedavg'"):
        CoordinatorConfig(**base, strategy="fedavg")
    with pytest.raises(ValueError, match="model: not used in mode 'pretrain'"):
        CoordinatorConfig(**base, model={"lookback": 24})


def test_a_fedal_agent_checks_globals_without_and_payload_size_with_its_coreset(tmp_path: Path) -> None:
    """The agent checks announced global states against the model alone (the core-set is not
    announced back), while its update-size check counts the core-set: 256 windows (the most a
    config allows, 124 kB) do not fit 100 kB, the model alone would."""
    cfg = load_config(pretrain_agent(tmp_path, free_port(), 0), AgentConfig)
    fleet = load_config(pretrain_coordinator(tmp_path, free_port()), CoordinatorConfig)
    assert Agent(cfg).layout == named_layout(layout_of(fleet_template(fleet, SEED).initial))
    big = cfg.fedal_client.model_copy(update={"coreset": cfg.fedal_client.coreset.model_copy(update={"size": 256})})
    with pytest.raises(ValueError, match=r"max_payload_bytes: this model's updates take about \d+ bytes"):
        Agent(cfg.model_copy(update={"fedal_client": big, "max_payload_bytes": 100_000}))


@pytest.mark.parametrize("device_side", [DEVICE_SIDE, None], ids=["fedal", "plain"])
def test_the_fleet_template_matches_what_pretrain_agents_upload(tmp_path: Path, device_side: dict | None) -> None:
    """Same signature, and updates laid out as the coordinator checks them, for FeDaL's devices
    (model + core-set) and FedPoD's plain masked pretraining (model alone, strategy fedavg)."""
    fleet = {**FLEET, "fedal_client": device_side} if device_side else {"mode": "pretrain", "foundation_model": FOUNDATION}
    coordinator = load_config(coordinator_config(tmp_path, free_port(), ROUNDS, fleet_model=fleet), CoordinatorConfig)
    agent = load_config(pretrain_agent(tmp_path, free_port(), 0, fleet), AgentConfig)
    learner = make_learner(agent, agent.data.load())
    template = fleet_template(coordinator, SEED)
    assert coordinator.strategy == ("fedal" if device_side else "fedavg")
    assert learner.signature == template.signature
    assert layout_of(learner.wire_state(1)) == template.update_layout
