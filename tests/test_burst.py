"""A burst of honest updates from many gateways at once, through a real mosquitto started from
the generated config, to a subscriber with the coordinator's settings: none may be lost."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt

from coordinator.broker_setup import write_fleet_setup
from coordinator.config import CoordinatorConfig
from edge_agent.config import AgentConfig, load_config
from edge_agent.broker_settings import COORDINATOR_RECEIVE_WINDOW
from edge_agent.mqtt import Connection
from edge_agent.topics import Topics
from tests.broker import Mosquitto, free_port

AGENTS = 100
PER_AGENT = 20  # 2,000 QoS 1 messages in all
COMMIT_S = 0.05  # what one of the coordinator's group commits costs before it acknowledges a batch
QUIET_S = 60  # give up only after this long without a single new message


def gateway(path: Path, port: int, connected: threading.Semaphore) -> mqtt.Client:
    """One agent's raw paho client with its own credentials, its loop running; released
    ``connected`` once the broker accepted it."""
    broker = load_config(path, AgentConfig).broker
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=path.stem, protocol=mqtt.MQTTv5)
    client.username_pw_set(broker.username, broker.password)
    client.on_connect = lambda *_: connected.release()
    client.connect_async("127.0.0.1", port)
    client.loop_start()
    return client


def coordinator_inbox(path: Path, topics: Topics) -> Connection:
    """A subscriber that holds messages like the coordinator: manual acknowledgement, a persistent
    session and the coordinator's receive window."""
    connection = Connection(
        load_config(path, CoordinatorConfig).broker, client_id="edgefl-coordinator-farm",
        will_topic=topics.coordinator_status, subscriptions=[topics.agents("update")], manual_ack=True,
        receive_maximum=COORDINATOR_RECEIVE_WINDOW,
    )
    connection.start()
    assert connection.connected.wait(30), "the coordinator's connection did not come up"
    return connection


def drain(connection: Connection, expected: int) -> set[bytes]:
    """Receive like the coordinator does (a batch, a commit, then the acks) until ``expected``
    distinct messages arrived or none arrived for ``QUIET_S``."""
    received: set[bytes] = set()
    last_progress = time.time()
    while len(received) < expected and time.time() - last_progress < QUIET_S:
        try:
            batch = [connection.inbox.get(timeout=0.1)]
        except queue.Empty:
            continue
        while not connection.inbox.empty():
            batch.append(connection.inbox.get_nowait())
        time.sleep(COMMIT_S)
        for message in batch:
            received.add(message.payload)
            connection.ack(message)
        last_progress = time.time()
    return received


def test_a_burst_of_honest_updates_from_the_whole_fleet_is_not_lost(tmp_path: Path) -> None:
    port = free_port()
    names = [f"agent{i:03d}" for i in range(AGENTS)]
    written = write_fleet_setup("farm", names, tmp_path / "setup", port=port)
    broker = Mosquitto(tmp_path / "broker", port=port, config=written["mosquitto.conf"]).start()
    topics = Topics("farm")
    coordinator = coordinator_inbox(written["coordinator.toml"], topics)
    connected = threading.Semaphore(0)
    gateways = [gateway(written[f"{name}.toml"], port, connected) for name in names]
    try:
        assert all(connected.acquire(timeout=120) for _ in names), "not every gateway connected"
        sent = [(client, client.publish(topics.agent(name, "update"), f"{name}:{i}".encode(), qos=1))
                for i in range(PER_AGENT) for name, client in zip(names, gateways)]
        received = drain(coordinator, AGENTS * PER_AGENT)
        for _, info in sent:
            info.wait_for_publish(30)
    finally:
        for client in gateways:
            client.disconnect()
            client.loop_stop()
        coordinator.stop()
        broker.stop()
    expected = {f"{name}:{i}".encode() for name in names for i in range(PER_AGENT)}
    assert received == expected, f"{len(expected - received)} lost; broker log:\n{broker.log()[-3000:]}"
    assert "being dropped" not in broker.log()
