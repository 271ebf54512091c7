"""Presence and campaigns with real processes on a real mosquitto: after a run every client is
shown offline with when it was last seen, and a second campaign on the same broker completes
although the first one's retained end is still there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import paho.mqtt.client as mqtt

from coordinator.store import Store
from edge_agent.config import dump_toml
from tests.fleet import agent_config, coordinator_config, exits, start, wait_for, write_client_csvs

ROUNDS = 2


def log_of(folder: Path, name: str) -> str:
    path = folder / f"{name}.log"
    return path.read_text() if path.exists() else ""


def run_campaign(folder: Path, port: int, csvs: list[Path]) -> Path:
    """A coordinator and one agent per CSV under ``folder``, run to the end; returns the state dir."""
    config = coordinator_config(folder, port, ROUNDS, min_clients=len(csvs), start_clients=len(csvs))
    processes = [start(folder, "coordinator", "coordinator", "serve", "-c", str(config))]
    processes += [start(folder, f"agent{i}", "agent", "run", "-c", str(agent_config(folder, port, i, csv)))
                  for i, csv in enumerate(csvs)]
    exits(processes)
    assert all(p.returncode == 0 for p in processes), log_of(folder, "coordinator")
    return folder / "coordinator"


def campaign_of(db: Path) -> str:
    store = Store(db)
    try:
        return store.campaign()
    finally:
        store.close()


def publish_retained(port: int, topic: str, payload: bytes) -> None:
    """What a buggy device could leave on its own topic: a retained message."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="buggy", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    client.disconnect()
    client.loop_stop()


def test_presence_after_a_run_and_a_second_campaign_on_the_same_broker(tmp_path: Path, mosquitto) -> None:
    csvs = write_client_csvs(tmp_path, 2)
    first = tmp_path / "first"
    first.mkdir()
    db = run_campaign(first, mosquitto.port, csvs)

    store = Store(db)
    clients = store.clients()
    store.close()
    assert set(clients) == {"client00", "client01"}
    assert not any(c.online for c in clients.values()), "agents that exited are still shown online"
    assert all(c.last_seen is not None for c in clients.values())
    for i in range(2):
        assert f"client{i:02d} exits: campaign {campaign_of(db)} finished" in log_of(first, f"agent{i}")
    status = subprocess.run(
        [sys.executable, "-m", "edgefl.cli", "coordinator", "status", "-c", str(first / "coordinator.toml")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "250"},
    )
    seen = re.findall(r"\d\d:\d\d:\d\dZ \(\d+ (?:s|min|h) ago\)", status.stdout)  # each client's last sign of life
    assert status.returncode == 0 and "last seen" in status.stdout and len(seen) == 2, status.stdout

    second = tmp_path / "second"
    second.mkdir()
    publish_retained(mosquitto.port, "edgefl/test/agents/client00/update", b"stale junk")
    fresh = start(second, "agent0", "agent", "run", "-c", str(agent_config(second, mosquitto.port, 0, csvs[0])))
    wait_for(lambda: "waiting for a new campaign" in log_of(second, "agent0"), 120,
             "the fresh agent to wait instead of exiting on the old campaign's end")
    config = coordinator_config(second, mosquitto.port, ROUNDS, min_clients=2, start_clients=2)
    coordinator = start(second, "coordinator", "coordinator", "serve", "-c", str(config))
    wait_for(lambda: "cleared the retained round 2 (finished) of campaign" in log_of(second, "coordinator"), 120,
             "the new coordinator to clear the old campaign's end")
    old_state = agent_config(second, mosquitto.port, 1, csvs[1])
    old_state.write_text(dump_toml({**tomllib.loads(old_state.read_text()), "state_dir": str(first / "agent1")}))
    veteran = start(second, "agent1", "agent", "run", "-c", str(old_state))
    exits([coordinator, fresh, veteran])
    assert all(p.returncode == 0 for p in (coordinator, fresh, veteran)), log_of(second, "coordinator")

    new_db = second / "coordinator"
    assert campaign_of(new_db) != campaign_of(db)
    store = Store(new_db)
    try:
        assert [len(store.updates(r)) for r in range(1, ROUNDS + 1)] == [2] * ROUNDS
    finally:
        store.close()
    # the coordinator subscribes to updates with retain handling 2: the broker never hands it the stale one
    assert "retained update of client00" not in log_of(second, "coordinator")
    assert f"state of campaign {campaign_of(db)} (round {ROUNDS}) dropped" in log_of(second, "agent1")
    assert log_of(second, "agent1").count("update sent") == ROUNDS


def test_a_state_keeps_its_campaign_and_each_clients_last_sign_of_life(tmp_path: Path) -> None:
    from edge_agent.protocol import HelloHeader

    store = Store(tmp_path)
    campaign = store.campaign()
    store.register(HelloHeader(fleet="f", sender="a", n_features=1, n_samples=1, model_signature="ab" * 8))
    registered = store.clients()["a"].last_seen
    store.set_online("a", False)
    assert store.clients()["a"].last_seen == registered, "a retained status is no sign of life"
    before = time.time()
    store.seen("a")
    assert store.clients()["a"].last_seen >= before >= registered and not store.clients()["a"].online
    store.close()
    again, other = Store(tmp_path), Store(tmp_path / "other")
    assert again.campaign() == campaign and other.campaign() != campaign
    again.close()
    other.close()
