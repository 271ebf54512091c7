"""The generated broker setup, run by a real mosquitto: passwords, ACL and TLS."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from coordinator.broker_setup import mosquitto_password_hash, write_fleet_setup
from edge_agent.config import AgentConfig, load_config
from coordinator.server import CoordinatorConfig
from tests.broker import Mosquitto, free_port


def credentials(path: Path) -> dict:
    return load_config(path, AgentConfig).broker.model_dump()


def connect(port: int, username: str, password: str, tls_ca: Path | None = None) -> tuple[mqtt.Client, int]:
    """Connect and return the client with the CONNACK reason code (0 = accepted)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"t-{username}-{time.time()}",
                         protocol=mqtt.MQTTv5)
    client.username_pw_set(username, password)
    if tls_ca:
        client.tls_set(ca_certs=str(tls_ca))
    result: dict[str, int] = {}
    connected = threading.Event()

    def on_connect(_c, _u, _f, reason_code, _p) -> None:
        result["rc"] = reason_code.value
        connected.set()

    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    connected.wait(10)
    return client, result.get("rc", -1)


@pytest.fixture
def fleet(tmp_path: Path):
    port = free_port()
    written = write_fleet_setup("farm", ["agent01", "agent02"], tmp_path / "setup", port=port)
    broker = Mosquitto(tmp_path / "broker", port=port, config=written["mosquitto.conf"]).start()
    yield port, written
    broker.stop()


def test_password_hash_is_mosquittos_pbkdf2_format() -> None:
    line = mosquitto_password_hash("secret", salt=b"0123456789ab")
    assert line.startswith("$7$101$MDEyMzQ1Njc4OWFi$") and line != mosquitto_password_hash("secret")


def test_generated_configs_validate(fleet) -> None:
    _, written = fleet
    coordinator = load_config(written["coordinator.toml"], CoordinatorConfig)
    assert coordinator.registration == "closed" and coordinator.allowed_clients == ["agent01", "agent02"]
    agent = load_config(written["agent01.toml"], AgentConfig)
    assert agent.broker.username == "agent01" and agent.data.site


def test_passwords_are_checked_by_the_broker(fleet) -> None:
    port, written = fleet
    creds = credentials(written["agent01.toml"])
    client, rc = connect(port, "agent01", creds["password"])
    assert rc == 0
    client.loop_stop()
    _, rc = connect(port, "agent01", "wrong password")
    assert rc != 0


def test_an_agent_cannot_publish_on_another_agents_topic(fleet) -> None:
    port, written = fleet
    coordinator_creds = load_config(written["coordinator.toml"], CoordinatorConfig).broker
    listener, rc = connect(port, "coordinator", coordinator_creds.password)
    assert rc == 0
    received: list[str] = []
    listener.on_message = lambda _c, _u, message: received.append(message.topic)
    listener.subscribe("edgefl/farm/agents/+/update", qos=1)
    time.sleep(0.3)
    agent, rc = connect(port, "agent01", credentials(written["agent01.toml"])["password"])
    assert rc == 0
    own = agent.publish("edgefl/farm/agents/agent01/update", b"mine", qos=1)
    forged = agent.publish("edgefl/farm/agents/agent02/update", b"forged", qos=1)
    own.wait_for_publish(5)
    forged.wait_for_publish(5)
    time.sleep(0.5)
    assert received == ["edgefl/farm/agents/agent01/update"]
    spy: list[str] = []
    agent.on_message = lambda _c, _u, message: spy.append(message.topic)
    agent.subscribe("edgefl/farm/agents/agent02/task", qos=1)
    listener.publish("edgefl/farm/agents/agent02/task", b"secret", qos=1).wait_for_publish(5)
    time.sleep(0.5)
    assert spy == []


def test_tls_with_the_generated_ca(tmp_path: Path) -> None:
    port = free_port()
    written = write_fleet_setup("farm", ["agent01"], tmp_path / "setup", port=port, tls=True)
    broker = Mosquitto(tmp_path / "broker", port=port, config=written["mosquitto.conf"]).start()
    try:
        creds = credentials(written["agent01.toml"])
        assert creds["tls_ca"] is not None
        client, rc = connect(port, "agent01", creds["password"], tls_ca=Path(creds["tls_ca"]))
        assert rc == 0
        client.publish("edgefl/farm/agents/agent01/status", b"online", qos=1).wait_for_publish(5)
        client.loop_stop()
        _, rc = connect(port, "agent01", creds["password"])
        assert rc != 0
    finally:
        broker.stop()
