"""Coordinator failover on PostgreSQL with real processes: a leader and a standby coordinator on
one database (each with its own state_dir, as on two hosts), agents over a real mosquitto. The
leader is killed with SIGKILL while round 1 holds an accepted update; the standby takes the lease,
resumes round 1 with that update, takes over the coordinator's broker session (with the second
agent, started after the kill), finishes the run, and every round equals the in-process
simulation of what the fleet did."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from typer.testing import CliRunner

from coordinator.store import Store
from edgefl.commands import app
from tests.fleet import agent_config, coordinator_config, start, wait_for, write_client_csvs
from tests.test_service import assert_rounds_equal, finish, replay, served_rounds, state

ROUNDS = 2


def coordinator_on(folder: Path, port: int, url: str) -> Path:
    """A coordinator config with its own state_dir below ``folder`` and the shared database:
    round 1 needs both clients, so it stays open with the first one's update; twins keep history."""
    folder.mkdir()
    return coordinator_config(folder, port, ROUNDS, min_clients=2, linger_s=10.0, twin="maf", store={"url": url})


def log_of(folder: Path, name: str) -> str:
    path = folder / f"{name}.log"
    return path.read_text() if path.exists() else ""


def test_standby_takes_over_from_a_killed_leader_with_every_accepted_update(
    tmp_path: Path, mosquitto, postgres_url: str
) -> None:
    paths = write_client_csvs(tmp_path, 2)
    leader_config = coordinator_on(tmp_path / "leader", mosquitto.port, postgres_url)
    standby_config = coordinator_on(tmp_path / "standby", mosquitto.port, postgres_url)
    leader = start(tmp_path, "leader", "coordinator", "serve", "-c", str(leader_config))
    wait_for(lambda: "leading fleet test" in log_of(tmp_path, "leader"), 60, "the leader to take the lease")
    standby = start(tmp_path, "standby", "coordinator", "serve", "-c", str(standby_config))
    first = start(tmp_path, "agent0", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, 0, paths[0])))
    wait_for(lambda: "standing by: fleet test is led by edgefl-coordinator" in log_of(tmp_path, "standby"), 60,
             "the standby to stand by")
    db = tmp_path / "leader" / "coordinator"
    wait_for(state(db, lambda s: s.latest_round() and s.updates(1), postgres_url), 90, "an update in round 1")
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait(10)
    accepted = accepted_updates(db, postgres_url)
    assert accepted == [(1, "client00")] and standby.poll() is None
    second = start(tmp_path, "agent1", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, 1, paths[1])))

    finish([standby, first, second], timeout=180)
    log = log_of(tmp_path, "standby")
    assert standby.returncode == 0, log
    assert "resuming round 1 with 1 accepted updates ['client00']" in log, log
    assert first.returncode == 0 and second.returncode == 0, log_of(tmp_path, "agent0") + log_of(tmp_path, "agent1")
    store = Store(tmp_path / "standby" / "coordinator", postgres_url)
    try:
        closed = [row for row in store.rounds() if row.closed_at is not None]
        assert [row.metrics["clients"] for row in closed] == [["client00", "client01"]] * ROUNDS
    finally:
        store.close()
    assert not list(tmp_path.glob("*/coordinator/**/*.safetensors"))  # tensors and twins: all in the database
    status = CliRunner(env={"COLUMNS": "250"}).invoke(app, ["coordinator", "status", "-c", str(standby_config)])
    assert status.exit_code == 0 and status.stdout.count("all participants reported") == ROUNDS, status.output
    assert "fleet test is led by no coordinator" in status.stdout, status.output
    assert_rounds_equal(served_rounds(db, postgres_url), replay(db, paths, ROUNDS, postgres_url, twin="maf").states)


def accepted_updates(db: Path, url: str) -> list[tuple[int, str]]:
    """The on-time updates the store holds (each was accepted in a committed batch)."""
    store = Store(db, url)
    try:
        return [(row.round, u.client_id) for row in store.rounds() for u in store.updates(row.round)]
    finally:
        store.close()
