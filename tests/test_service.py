"""The fleet for real: coordinator and agents as processes talking through a real mosquitto."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.participation import recorded
from coordinator.simulation.prompts import PromptFederationConfig, run_prompt_federation
from coordinator.strategy_settings import GraphSettings
from coordinator.store import Store
from coordinator.twins import make_forecaster
from edge_agent.data import load_site
from edge_agent.models import ModelConfig
from edge_agent.models.prompt_settings import PromptConfig
from edge_agent.candidates import quality, served_name, validation_scores
from tests.fleet import (
    MODEL,
    SEED,
    TRAINING,
    agent_config,
    coordinator_config,
    exits,
    simulation_clients,
    start,
    wait_for,
    write_client_csvs,
)

ROUNDS = 3
PROMPT_SITES = ("amsterdam", "miami", "greensboro")


def replay(db: Path, paths: list[Path], rounds: int, url: str | None = None, **federation: object):
    """The in-process simulation of what the fleet did: same seeds, same participation (read from
    the coordinator's store, in ``db`` or at ``url``), same twins."""
    store = Store(db, url)
    try:
        happened = recorded(store, [f"client{i:02d}" for i in range(len(paths))])
    finally:
        store.close()
    fed = FederationConfig(
        rounds=rounds, local_epochs=TRAINING["local_epochs"], batch_size=TRAINING["batch_size"],
        lr=TRAINING["lr"], seed=SEED, test_every_round=False, **federation,
    )
    return run_federation(simulation_clients(paths), ModelConfig(**MODEL), fed, participation=happened)


def served_rounds(db: Path, url: str | None = None) -> list[dict[str, torch.Tensor]]:
    """The global state each closed round produced, as the coordinator stored it."""
    store = Store(db, url)
    try:
        return [store.load_file(row.result_file) for row in store.rounds() if row.closed_at is not None]
    finally:
        store.close()


def assert_rounds_equal(served: list[dict[str, torch.Tensor]], simulated: list[dict[str, torch.Tensor]]) -> None:
    assert len(served) == len(simulated)
    for number, (mine, theirs) in enumerate(zip(served, simulated), 1):
        assert mine.keys() == theirs.keys(), f"round {number}"
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-5, atol=1e-6, msg=f"round {number}: {name}")


def state(db: Path, predicate: Callable, url: str | None = None) -> Callable[[], bool]:
    """A check for ``wait_for`` that opens the coordinator's store, asks, and closes it."""

    def check() -> bool:
        store = Store(db, url)
        try:
            return bool(predicate(store))
        finally:
            store.close()

    return check


def last_on_time(store: Store, client: str) -> int:
    """The newest round in which ``client``'s update arrived on time (0: none yet)."""
    return max((r.round for r in store.rounds() if client in {u.client_id for u in store.updates(r.round)}), default=0)


def store_metrics(db: Path, number: int) -> dict[str, dict]:
    """Each client's reported metrics for round ``number``."""
    store = Store(db)
    try:
        return {u.client_id: u.metrics for u in store.updates(number, include_late=True)}
    finally:
        store.close()


def missed_after(store: Store, client: str, after: int) -> list[int]:
    """Closed rounds after ``after`` that closed without an on-time update of ``client``."""
    return [r.round for r in store.rounds() if r.round > after and r.closed_at and client not in r.metrics["clients"]]


def on_time_rounds(store: Store, client: str) -> int:
    """How many rounds have an on-time update of ``client``."""
    return sum(client in {u.client_id for u in store.updates(r.round)} for r in store.rounds())


def run_agents(tmp_path: Path, port: int, paths: list[Path], training: dict | None = None,
               extra: dict | None = None, **broker: object) -> list:
    return [start(tmp_path, f"agent{i}", "agent", "run", "-c",
                  str(agent_config(tmp_path, port, i, p, training, extra=extra, **broker))) for i, p in enumerate(paths)]


def start_fleet(
    tmp_path: Path, port: int, n_agents: int, rounds: int = ROUNDS, agent_broker: dict | None = None,
    training: dict | None = None, agent_extra: dict | None = None, **overrides: object,
):
    """Client CSVs, a coordinator and one agent per CSV, all started: (coordinator, agents, state dir).
    Round 1 waits for the whole fleet, so a slow-starting agent is never late for it."""
    paths = write_client_csvs(tmp_path, n_agents)
    config = coordinator_config(tmp_path, port, rounds, **{"start_clients": n_agents, **overrides})
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    agents = run_agents(tmp_path, port, paths, training, agent_extra, **(agent_broker or {}))
    return coordinator, agents, tmp_path / "coordinator"


def finish(processes: list, timeout: float = 120) -> None:
    """Wait for the fleet to exit; ``timeout``: the seconds its logs may stay silent (see :func:`exits`)."""
    exits(processes, quiet_s=timeout)


def test_gateways_keeping_a_local_model_say_which_model_they_serve(tmp_path: Path, mosquitto) -> None:
    """With keep_local and anchors each agent reports every candidate's validation score; the
    coordinator's status shows which models each gateway serves (the mean of its two best, the
    recipe's ``combine``), and the forecast says which made it."""
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 2, 2, training={"keep_local": True, "anchors": ["seasonal_naive"]},
                                          min_clients=2)
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    metrics = store.latest_metrics()
    store.close()
    assert set(metrics) == {"client00", "client01"}
    for m in metrics.values():
        scores = validation_scores(m)
        assert set(scores) == {"federated", "local", "seasonal_naive", "median"}  # the median of the three
        assert served_name(m) == " + ".join(sorted(scores, key=scores.__getitem__)[:2])
    first = store_metrics(db, 1)  # before round 1 no local model exists yet: federated and the anchor (no median of two)
    assert all("val.local" not in m and set(served_name(m).split(" + ")) == {"federated", "seasonal_naive"}
               for m in first.values())
    status = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "coordinator", "status", "-c", str(tmp_path / "coordinator.toml")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"},
    )
    assert status.returncode == 0 and "…" not in status.stdout, status.stdout  # nothing cut at 80 columns
    for client, m in metrics.items():  # what it serves, its validation MASE and its best anchor's
        scores, served = validation_scores(m), quality(m)["served"]
        assert (f"{client} serves {served_name(m)} (val MASE {served:.3f}; best anchor "
                f"seasonal_naive {scores['seasonal_naive']:.3f}, ") in status.stdout, status.stdout
    forecast = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "agent", "forecast", "--csv", "-c", str(tmp_path / "agent0.toml")],
        capture_output=True, text=True, timeout=120,
    )
    assert forecast.returncode == 0, forecast.stderr
    assert "client00: forecast by the " in forecast.stderr
    lines = forecast.stdout.strip().splitlines()
    assert len(lines) == 1 + MODEL["horizon"] and lines[0].startswith("time,")
    assert lines[1].startswith("2022-01-01 00:00:00,") and lines[-1].startswith("2022-01-01 11:00:00,")
    assert all(len(line.split(",")) == len(lines[0].split(",")) for line in lines)


def test_coordinator_killed_mid_round_resumes_without_losing_accepted_updates(tmp_path: Path, mosquitto) -> None:
    paths = write_client_csvs(tmp_path, 3)
    config = str(coordinator_config(tmp_path, mosquitto.port, ROUNDS, min_clients=3))
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", config)
    agents = run_agents(tmp_path, mosquitto.port, paths)
    db = tmp_path / "coordinator"

    wait_for(state(db, lambda s: s.latest_round() and len(s.updates(2)) >= 1), 120, "an update in round 2")
    os.kill(coordinator.pid, signal.SIGKILL)
    coordinator.wait(10)
    store = Store(db)
    accepted_before = {(u.round, u.client_id) for r in (1, 2) for u in store.updates(r)}
    store.close()
    restarted = start(tmp_path, "coordinator-restarted", "coordinator", "serve", "-c", config)
    finish([restarted, *agents])
    assert restarted.returncode == 0, (tmp_path / "coordinator-restarted.log").read_text()
    store = Store(db)
    accepted_after = {(u.round, u.client_id) for r in range(1, ROUNDS + 1) for u in store.updates(r)}
    assert accepted_before <= accepted_after
    assert all(len(store.updates(r)) == 3 for r in range(1, ROUNDS + 1))
    store.close()
    for i in range(3):
        log = (tmp_path / f"agent{i}.log").read_text()
        assert log.count("update sent") == ROUNDS, f"agent{i} re-trained an accepted round:\n{log}"
    assert_rounds_equal(served_rounds(db), replay(db, paths, ROUNDS).states)


def test_agent_killed_mid_round_is_marked_offline_and_the_round_still_closes(tmp_path: Path, mosquitto) -> None:
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 3, min_clients=2, round_timeout_s=8.0)

    wait_for(state(db, lambda s: s.latest_round() and s.latest_round().round >= 2), 120, "round 1 to close")
    os.kill(agents[2].pid, signal.SIGKILL)
    finish([coordinator, agents[0], agents[1]])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    assert store.clients()["client02"].online is False
    later = [r for r in store.rounds() if r.round >= 3]
    assert later and all("client02" not in r.metrics["clients"] for r in later)
    assert all(len(r.metrics["clients"]) == 2 for r in later)
    store.close()


def test_broker_outage_mid_run_buffers_updates_and_the_run_finishes(tmp_path: Path, mosquitto) -> None:
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 2, min_clients=2)

    wait_for(state(db, lambda s: s.latest_round() and s.latest_round().round >= 2), 120, "round 2 to open")
    mosquitto.stop()
    time.sleep(3)
    mosquitto.start()
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    assert [len(store.updates(r)) for r in range(1, ROUNDS + 1)] == [2] * ROUNDS
    store.close()


def test_round_one_waits_for_start_clients_before_it_is_announced(tmp_path: Path, mosquitto) -> None:
    paths = write_client_csvs(tmp_path, 2)
    config = coordinator_config(tmp_path, mosquitto.port, 1, min_clients=1, start_clients=2, round_timeout_s=60.0)
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    db = tmp_path / "coordinator"
    first = start(tmp_path, "agent0", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, 0, paths[0])))
    wait_for(state(db, lambda s: "client00" in s.clients()), 120, "client00 to register")
    time.sleep(4)  # without the hold, client00 (the only one online, a quorum) would have closed round 1 by now
    assert not state(db, lambda s: s.updates(1))()
    assert "waiting for the fleet: 1/2 clients registered" in (tmp_path / "coordinator.log").read_text()
    second = start(tmp_path, "agent1", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, 1, paths[1])))
    finish([coordinator, first, second])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    assert [u.client_id for u in store.updates(1)] == ["client00", "client01"]
    store.close()


@pytest.mark.parametrize("twin", ["drop", "wsf"])
def test_every_round_with_a_frozen_agent_equals_the_simulation_of_what_happened(
    tmp_path: Path, mosquitto, twin: str
) -> None:
    """client02 is frozen (SIGSTOP) after its second on-time update and stays connected (keepalive
    60 s), so the next round waits for it only until quorum + grace (2 of 3; or its deadline,
    whichever comes first) and closes without it: imputed by its twin (or dropped). Thawed, it sends that round's update late (twin history,
    and a stand-in at the next close where it has no on-time update). Whatever the timing on a
    loaded machine, every round's global state equals the in-process simulation of the
    participation the store recorded. Every twin forecaster is checked against the simulation in-process
    (tests/test_twins.py); here the service's two paths, dropped and imputed, at 80 s each."""
    rounds = 5
    coordinator, agents, db = start_fleet(
        tmp_path, mosquitto.port, 3, rounds, agent_broker={"keepalive_s": 60}, min_clients=2, round_timeout_s=6.0,
        twin=twin,
    )
    wait_for(state(db, lambda s: on_time_rounds(s, "client02") >= 2), 180, "two on-time updates of client02")
    os.kill(agents[2].pid, signal.SIGSTOP)
    try:
        seen = state(db, lambda s: last_on_time(s, "client02"))()
        assert seen < rounds, "client02 reported on time only at the end of the run"
        wait_for(state(db, lambda s: missed_after(s, "client02", seen)), 120, "a round to close without client02")
    finally:
        os.kill(agents[2].pid, signal.SIGCONT)
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    try:
        record = store.round(missed_after(store, "client02", seen)[0]).metrics
        # quorum + grace, or the 6 s deadline where the quorum itself took over 4 s (a loaded machine)
        assert record["closed_by"] in ("quorum + grace", "deadline") and record["twin"] == twin
        assert record["imputed" if twin != "drop" else "dropped"] == ["client02"]
        assert any(e["code"] == "late" and e["client_id"] == "client02" for e in store.events(accepted=True))
        assert len(store.tensors.names("twins/client02")) == make_forecaster(twin).window
    finally:
        store.close()
    assert_rounds_equal(served_rounds(db), replay(db, write_client_csvs(tmp_path, 3), rounds, twin=twin).states)
    status = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "coordinator", "status", "-c", str(tmp_path / "coordinator.toml")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )
    assert status.returncode == 0, status.stderr
    assert (f"client02 ({twin})" in status.stdout) == (twin != "drop")


def test_three_prompt_mode_agents_receive_their_own_personalized_prompts(tmp_path: Path, mosquitto) -> None:
    from edge_agent.config import dump_toml
    from edge_agent.models.foundation import FoundationModel, load_foundation, save_foundation
    from edge_agent.models.foundation_config import FoundationConfig

    torch.manual_seed(0)
    fm_path = tmp_path / "foundation.safetensors"
    digest = save_foundation(FoundationModel(FoundationConfig(d_model=16, heads=2, layers=1, d_ff=32)), fm_path)
    common = {"fleet": "test", "mode": "prompt", "foundation": str(fm_path), "foundation_sha256": digest,
              "prompt": {"lookback": 12, "horizon": 12}}
    coordinator_toml = tmp_path / "coordinator.toml"
    coordinator_toml.write_text(dump_toml({
        **common, "state_dir": str(tmp_path / "coordinator"), "rounds": 2, "min_clients": 3, "round_timeout_s": 60.0,
        "fedpod": {"graph_epochs": 5}, "broker": {"port": mosquitto.port},
    }))
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(coordinator_toml))
    agents = []
    for index, site in enumerate(PROMPT_SITES):
        path = tmp_path / f"agent{index}.toml"
        path.write_text(dump_toml({
            **common, "client_id": f"client{index:02d}", "state_dir": str(tmp_path / f"agent{index}"),
            "client_index": index, "data": {"site": site},
            "training": {"local_epochs": 1, "batch_size": 64, "lr": 0.01, "stride": 24},
            "broker": {"port": mosquitto.port, "keepalive_s": 5},
        }))
        agents.append(start(tmp_path, f"agent{index}", "agent", "run", "-c", str(path)))
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    db = tmp_path / "coordinator"
    store = Store(db)
    try:
        for number in (1, 2):
            messages = store.personal_messages(number)
            assert list(messages) == ["client00", "client01", "client02"]
            personal = [message["personalized"] for message in messages.values()]
            assert not torch.equal(personal[0], personal[1]) and not torch.equal(personal[1], personal[2])
        update = store.load_update(store.updates(1)[0])
        assert update and all(name.startswith(("prompts.", "shared.")) for name in update)
        assert store.strategy_state(2) is not None  # trained graphs persist for a restart
        happened = recorded(store, [f"client{i:02d}" for i in range(3)])
        sent = store.personal_messages(2)
    finally:
        store.close()
    for index in range(3):
        assert "round 1: personalized update received" in (tmp_path / f"agent{index}.log").read_text()

    tables = [dataclasses.replace(load_site(site), name=f"client{i:02d}") for i, site in enumerate(PROMPT_SITES)]
    cfg = PromptFederationConfig(rounds=2, local_epochs=1, batch_size=64, lr=0.01, stride=24,
                                 fedpod=GraphSettings(graph_epochs=5))
    learners, simulated = run_prompt_federation(tables, load_foundation(fm_path), PromptConfig(lookback=12, horizon=12),
                                                cfg, participation=happened)
    assert_rounds_equal(served_rounds(db), [r.global_state for r in simulated])
    for index, learner in enumerate(learners):
        torch.testing.assert_close(sent[f"client{index:02d}"]["personalized"], learner.references["personalized"],
                                   rtol=1e-5, atol=1e-6)

    wrong = tmp_path / "agent0.toml"
    wrong.write_text(wrong.read_text().replace(digest, "0" * 64))
    proc = subprocess.run([sys.executable, "-m", "edgefl.cli", "agent", "run", "-c", str(wrong)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "differs from the coordinator's" in proc.stdout + proc.stderr
