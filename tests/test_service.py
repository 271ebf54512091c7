"""The fleet for real: coordinator and agents as processes talking through a real mosquitto."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import signal
from collections.abc import Callable
from pathlib import Path

import torch

from coordinator.aggregators import ClientUpdate, make_aggregator
from coordinator.simulate import FederationConfig, run_federation
from coordinator.store import Store
from coordinator.twins import TwinHistory, impute_missing, make_forecaster
from edge_agent.models import ModelConfig
from tests.fleet import (
    MODEL,
    SEED,
    TRAINING,
    agent_config,
    coordinator_config,
    simulation_clients,
    start,
    wait_for,
    write_client_csvs,
)

ROUNDS = 3


def simulate(paths: list[Path]) -> dict[str, torch.Tensor]:
    fed = FederationConfig(
        rounds=ROUNDS, local_epochs=TRAINING["local_epochs"], batch_size=TRAINING["batch_size"],
        lr=TRAINING["lr"], seed=SEED, test_every_round=False,
    )
    return run_federation(simulation_clients(paths), ModelConfig(**MODEL), fed).shared


def final_global(state_dir: Path) -> dict[str, torch.Tensor]:
    store = Store(state_dir)
    try:
        latest = store.latest_round()
        assert latest.round == ROUNDS and latest.closed_at is not None
        return store.load_file(latest.result_file)
    finally:
        store.close()


def state(db: Path, predicate: Callable) -> Callable[[], bool]:
    """A check for ``wait_for`` that opens the coordinator's store, asks, and closes it."""

    def check() -> bool:
        store = Store(db)
        try:
            return bool(predicate(store))
        finally:
            store.close()

    return check


def last_on_time(store: Store, client: str) -> int:
    """The newest round in which ``client``'s update arrived on time (0: none yet)."""
    return max((r.round for r in store.rounds() if client in {u.client_id for u in store.updates(r.round)}), default=0)


def run_agents(tmp_path: Path, port: int, paths: list[Path], **broker: object) -> list:
    return [start(tmp_path, f"agent{i}", "agent", "run", "-c", str(agent_config(tmp_path, port, i, p, **broker)))
            for i, p in enumerate(paths)]


def start_fleet(
    tmp_path: Path, port: int, n_agents: int, rounds: int = ROUNDS, agent_broker: dict | None = None,
    **overrides: object,
):
    """Client CSVs, a coordinator and one agent per CSV, all started: (coordinator, agents, state dir).
    Round 1 waits for the whole fleet, so a slow-starting agent is never late for it."""
    paths = write_client_csvs(tmp_path, n_agents)
    config = coordinator_config(tmp_path, port, rounds, **{"start_clients": n_agents, **overrides})
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    return coordinator, run_agents(tmp_path, port, paths, **(agent_broker or {})), tmp_path / "coordinator"


def finish(processes: list, timeout: float = 120) -> None:
    for process in processes:
        process.wait(timeout)


def test_three_agents_three_rounds_equal_the_in_process_simulation(tmp_path: Path, mosquitto) -> None:
    paths = write_client_csvs(tmp_path, 3)
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c",
                        str(coordinator_config(tmp_path, mosquitto.port, ROUNDS, min_clients=3)))
    agents = run_agents(tmp_path, mosquitto.port, paths)
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    served = final_global(tmp_path / "coordinator")
    expected = simulate(paths)
    assert served.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(served[name], expected[name], rtol=1e-5, atol=1e-6)
    forecast = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "agent", "forecast", "--csv", "-c", str(tmp_path / "agent0.toml")],
        capture_output=True, text=True, timeout=120,
    )
    assert forecast.returncode == 0, forecast.stderr
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
    expected = simulate(paths)
    served = final_global(db)
    for name in expected:
        torch.testing.assert_close(served[name], expected[name], rtol=1e-5, atol=1e-6)


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


def test_a_silent_agent_does_not_hold_the_round_past_its_deadline(tmp_path: Path, mosquitto) -> None:
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 3, min_clients=2, round_timeout_s=4.0)

    wait_for(state(db, lambda s: last_on_time(s, "client02") >= 1), 120, "an on-time update of client02")
    os.kill(agents[2].pid, signal.SIGSTOP)  # alive for the broker (keepalive 5 s) but silent
    try:
        silent = state(db, lambda s: last_on_time(s, "client02"))() + 1
        assert silent <= ROUNDS, "client02 reported on time only in the last round"
        wait_for(state(db, lambda s: len(s.rounds()) >= silent and s.round(silent).closed_at), 60,
                 f"round {silent} to close")
    finally:
        os.kill(agents[2].pid, signal.SIGCONT)
    finish([coordinator, *agents])
    store = Store(db)
    record = store.round(silent)
    assert record.metrics["closed_by"] == "deadline"
    assert sorted(record.metrics["clients"]) == ["client00", "client01"]
    assert store.latest_round().round == ROUNDS
    store.close()


def test_a_stopped_agent_is_imputed_by_its_twin_and_its_late_updates_kept_as_history(
    tmp_path: Path, mosquitto
) -> None:
    """client03 is frozen for two rounds right after an on-time update (round 1, or 2 when its cold
    start missed round 1's deadline) but stays connected (keepalive 60 s), so both rounds wait for
    it until their deadline. Thawed, it sends both updates (late) before its next one, which the
    next round waits for: no race with the end of the run."""
    rounds = 6
    coordinator, agents, db = start_fleet(
        tmp_path, mosquitto.port, 4, rounds, agent_broker={"keepalive_s": 60}, min_clients=2, round_timeout_s=10.0,
        twin="wsf",
    )

    wait_for(state(db, lambda s: last_on_time(s, "client03") >= 1), 120, "an on-time update of client03")
    os.kill(agents[3].pid, signal.SIGSTOP)
    try:
        seen = state(db, lambda s: last_on_time(s, "client03"))()
        frozen = [seen + 1, seen + 2]
        assert frozen[-1] < rounds, f"client03 first reported on time in round {frozen[0] - 1}: too late for this run"
        wait_for(state(db, lambda s: len(s.rounds()) >= frozen[-1] and s.round(frozen[-1]).closed_at), 60,
                 f"round {frozen[-1]} to close")
    finally:
        os.kill(agents[3].pid, signal.SIGCONT)
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    try:
        assert store.latest_round().round == rounds and store.latest_round().closed_at
        history = TwinHistory(2)  # what the coordinator had seen of client03 when it froze
        for number in range(1, frozen[0]):
            for update in store.updates(number, include_late=True):
                if update.client_id == "client03":
                    history.observe("client03", number, store.load_update(update))
        weight = store.clients()["client03"].n_samples
        (twin,) = impute_missing([("client03", weight)], history, make_forecaster("wsf")).updates
        for number in frozen:
            record = store.round(number).metrics
            assert record["closed_by"] == "deadline"
            assert record["imputed"] == ["client03"] and record["twin"] == "wsf"
            assert sorted(record["clients"]) == ["client00", "client01", "client02"]
            on_time = [ClientUpdate(u.client_id, store.load_update(u), u.n_samples) for u in store.updates(number)]
            expected = make_aggregator("fedavg").aggregate(on_time + [twin])
            result = store.load_file(store.round(number).result_file)
            assert all(torch.equal(result[k], expected[k]) for k in expected)
        late = [e for e in store.events(accepted=True) if e["code"] == "late" and e["client_id"] == "client03"]
        assert {e["round"] for e in late} >= set(frozen)
        assert {u.client_id for u in store.updates(frozen[0], include_late=True)} == {f"client0{i}" for i in range(4)}
        assert len(list((db / "twins" / "client03").glob("*.safetensors"))) == 2  # bounded window
        assert store.last_reported() == {f"client0{i}": rounds for i in range(4)}
    finally:
        store.close()
    status = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "coordinator", "status", "-c", str(tmp_path / "coordinator.toml")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if "client03 (wsf)" in line]
    assert len(rows) == 2 and all("deadline" in row for row in rows)


def test_three_prompt_mode_agents_receive_their_own_personalized_prompts(tmp_path: Path, mosquitto) -> None:
    from safetensors.torch import load_file

    from edge_agent.config import dump_toml
    from edge_agent.models.foundation import FoundationConfig, FoundationModel, save_foundation

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
    for index, site in enumerate(("amsterdam", "miami", "greensboro")):
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
    for number in (1, 2):
        files = sorted((db / "personal" / f"round_{number:05d}").glob("*.safetensors"))
        assert [f.stem for f in files] == ["client00", "client01", "client02"]
        personal = [load_file(str(f))["personalized"] for f in files]
        assert not torch.equal(personal[0], personal[1]) and not torch.equal(personal[1], personal[2])
    store = Store(db)
    try:
        update = store.load_update(store.updates(1)[0])
        assert update and all(name.startswith(("prompts.", "shared.")) for name in update)
    finally:
        store.close()
    for index in range(3):
        assert "round 1: personalized prompts received" in (tmp_path / f"agent{index}.log").read_text()
    assert (db / "fedpod_graphs.safetensors").is_file()  # trained graphs persist for a restart

    wrong = tmp_path / "agent0.toml"
    wrong.write_text(wrong.read_text().replace(digest, "0" * 64))
    proc = subprocess.run([sys.executable, "-m", "edgefl.cli", "agent", "run", "-c", str(wrong)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "differs from the coordinator's" in proc.stdout + proc.stderr
