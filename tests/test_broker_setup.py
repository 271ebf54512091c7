"""The generated broker setup, run by a real mosquitto: passwords, ACL and TLS."""

from __future__ import annotations

import logging
import os
import threading
import time
import tomllib
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from coordinator.broker_setup import COORDINATOR_USER, MQTT_HEADERS, mosquitto_password_hash, write_fleet_setup
from edge_agent.broker_settings import BrokerConfig
from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.mqtt import Connection
from coordinator.config import CoordinatorConfig
from tests.broker import Mosquitto, free_port


def credentials(path: Path) -> dict:
    return load_config(path, AgentConfig).broker.model_dump()


def connect(port: int, username: str, password: str, tls_ca: Path | None = None, client_id: str | None = None,
            persistent: bool = False) -> tuple[mqtt.Client, int]:
    """Connect and return the client with the CONNACK reason code (0 = accepted); ``persistent``:
    resume (or start) a session that outlives the connection, as the services do."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or f"t-{username}-{time.time()}",
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
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    client.connect("127.0.0.1", port, clean_start=not persistent, properties=props)
    client.loop_start()
    connected.wait(10)
    return client, result.get("rc", -1)


def password(written: dict[str, Path], user: str) -> str:
    """``user``'s password from the TOML written for it."""
    if user == COORDINATOR_USER:
        return load_config(written["coordinator.toml"], CoordinatorConfig).broker.password
    return credentials(written[f"{user}.toml"])["password"]


def collect(client: mqtt.Client, *topics: str) -> list[bytes]:
    """Subscribe ``client`` to ``topics`` (QoS 1, one SUBSCRIBE); the payloads it receives land in the list."""
    received: list[bytes] = []
    subscribed = threading.Event()
    client.on_message = lambda _c, _u, message: received.append(bytes(message.payload))
    client.on_subscribe = lambda *_: subscribed.set()
    client.subscribe([(topic, SubscribeOptions(qos=1)) for topic in topics])
    assert subscribed.wait(10), f"no SUBACK for {topics}"
    return received


def wait_until(condition, what: str, timeout: float = 20) -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


LIMIT = 4096  # max_payload_bytes of the test fleet


@pytest.fixture
def fleet(tmp_path: Path):
    port = free_port()
    written = write_fleet_setup("farm", ["agent01", "agent02"], tmp_path / "setup", port=port, max_payload_bytes=LIMIT)
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


def connect_failure_logged(broker: BrokerConfig, caplog: pytest.LogCaptureFixture) -> tuple[str, float]:
    """Start a client session (the agent's and the site aggregator's) against ``broker``: the
    first line it logs about the failure, and how long after the start that came."""
    connection = Connection(broker, client_id="probe", will_topic="probe/status", subscriptions=[])
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="edgefl.mqtt"):
        connection.start()
        try:
            wait_until(lambda: caplog.records, "a connect failure logged", timeout=10)
        finally:
            connection.stop()
    return caplog.records[0].getMessage(), time.monotonic() - started


def test_a_wrong_password_or_an_unreachable_broker_is_logged_within_5_s(fleet, caplog) -> None:
    port, _ = fleet
    line, seconds = connect_failure_logged(BrokerConfig(port=port, username="agent01", password="wrong"), caplog)
    assert f"127.0.0.1:{port}" in line and "Not authorized (check [broker] username and password)" in line and seconds < 5, (line, seconds)
    caplog.clear()
    closed = free_port()
    line, seconds = connect_failure_logged(BrokerConfig(port=closed), caplog)
    assert f"127.0.0.1:{closed}" in line and "refused" in line and seconds < 5, (line, seconds)


def test_a_wrong_password_is_one_line_while_paho_retries(fleet, caplog) -> None:
    """Refused three times (about 7 s of retries): one line, and no second cause for the drop
    that follows each refusal."""
    port, _ = fleet
    connection = Connection(BrokerConfig(port=port, username="agent01", password="wrong"), client_id="probe",
                            will_topic="probe/status", subscriptions=[])
    refusals: list[int] = []
    refuse = connection.client.on_connect
    connection.client.on_connect = lambda *args: (refusals.append(1), refuse(*args))
    with caplog.at_level(logging.INFO, logger="edgefl.mqtt"):
        connection.start()
        try:
            wait_until(lambda: len(refusals) >= 3, "three refused connects", timeout=60)
        finally:
            connection.stop()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "Not authorized" in lines[0], lines


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


def test_a_device_cannot_take_over_another_clients_session(fleet) -> None:
    """agent01, with its own valid credentials, connects with the coordinator's and with
    agent02's client id: the broker binds the id to the username, so both victims stay online."""
    port, written = fleet
    victims = {user: connect(port, user, password(written, user), client_id=client_id, persistent=True)[0]
               for user, client_id in (("coordinator", "edgefl-coordinator-farm"), ("agent02", "edgefl-agent-farm-agent02"))}
    dropped: list[str] = []
    for user, client in victims.items():
        client.on_disconnect = lambda *_args, user=user: dropped.append(user)
    inbox = collect(victims["coordinator"], "edgefl/farm/agents/+/update")
    for stolen in ("edgefl-coordinator-farm", "edgefl-agent-farm-agent02"):
        attacker, rc = connect(port, "agent01", password(written, "agent01"), client_id=stolen, persistent=True)
        assert rc == 0
        attacker.publish("edgefl/farm/agents/agent01/update", stolen.encode(), qos=1).wait_for_publish(5)
        attacker.disconnect()
        attacker.loop_stop()
    victims["agent02"].publish("edgefl/farm/agents/agent02/update", b"still here", qos=1).wait_for_publish(5)
    wait_until(lambda: b"still here" in inbox, "agent02's update")
    assert dropped == [] and all(client.is_connected() for client in victims.values())


def test_persistent_sessions_still_work_with_client_ids_bound_to_usernames(fleet) -> None:
    """What the broker queued for an offline agent is delivered when it comes back, whatever
    client id its software sends."""
    port, written = fleet
    agent, _ = connect(port, "agent01", password(written, "agent01"), client_id="first", persistent=True)
    collect(agent, "edgefl/farm/agents/agent01/task")
    agent.disconnect()
    agent.loop_stop()
    coordinator, _ = connect(port, "coordinator", password(written, "coordinator"))
    coordinator.publish("edgefl/farm/agents/agent01/task", b"queued for you", qos=1).wait_for_publish(5)
    received: list[bytes] = []
    back = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="second", protocol=mqtt.MQTTv5)
    back.username_pw_set("agent01", password(written, "agent01"))
    back.on_message = lambda _c, _u, message: received.append(bytes(message.payload))
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    back.connect("127.0.0.1", port, clean_start=False, properties=props)
    back.loop_start()
    try:
        wait_until(lambda: received == [b"queued for you"], "the queued message")
    finally:
        back.loop_stop()


def test_the_broker_refuses_a_packet_over_max_payload_bytes_as_it_arrives(fleet, tmp_path: Path) -> None:
    """The oversized publish never reaches the coordinator: mosquitto disconnects its sender at the
    packet's fixed header (paho reconnects and resends it: only the sender is hurt)."""
    port, written = fleet
    assert f"max_packet_size {LIMIT + MQTT_HEADERS}\n" in written["mosquitto.conf"].read_text()
    assert load_config(written["coordinator.toml"], CoordinatorConfig).max_payload_bytes == LIMIT
    assert load_config(written["agent01.toml"], AgentConfig).max_payload_bytes == LIMIT
    coordinator, _ = connect(port, "coordinator", password(written, "coordinator"))
    inbox = collect(coordinator, "edgefl/farm/agents/+/update")
    agent, dropped = device(port, written, "agent01")
    agent.publish("edgefl/farm/agents/agent01/update", b"y" * LIMIT, qos=1).wait_for_publish(5)
    agent.publish("edgefl/farm/agents/agent01/update", b"x" * (LIMIT + MQTT_HEADERS + 1), qos=1)
    try:
        wait_until(lambda: dropped.is_set() and "agent01 disconnected due to oversize packet" in broker_log(tmp_path),
                   "the broker's refusal of the big one")
    finally:
        agent.loop_stop()
    wait_until(lambda: inbox, "the legal one")
    assert inbox == [b"y" * LIMIT]


def device(port: int, written: dict[str, Path], user: str) -> tuple[mqtt.Client, threading.Event]:
    """``user`` connected with its own credentials, and an event set when its connection drops."""
    client, rc = connect(port, user, password(written, user))
    assert rc == 0
    dropped = threading.Event()
    client.on_disconnect = lambda *_: dropped.set()
    return client, dropped


def broker_log(tmp_path: Path) -> str:
    return (tmp_path / "broker" / "mosquitto.log").read_text()


def test_secret_files_are_never_readable_by_others(tmp_path: Path, monkeypatch) -> None:
    """Created 0600 from the first byte (no chmod afterwards), even with a permissive umask,
    and again when the setup is written over an existing one."""
    monkeypatch.setattr("os.chmod", lambda *_: pytest.fail("secrets must be created 0600, not chmod-ed"))
    old = os.umask(0)
    try:
        for _ in range(2):
            written = write_fleet_setup("farm", ["agent01"], tmp_path / "setup", tls=True)
    finally:
        os.umask(old)
    secrets = [written["passwords"], written["coordinator.toml"], written["agent01.toml"], tmp_path / "setup" / "server.key"]
    assert {oct(path.stat().st_mode & 0o777) for path in secrets} == {"0o600"}
    assert not list((tmp_path / "setup").rglob("*.tmp"))


def test_toml_round_trips_strings_with_newlines_and_quotes(tmp_path: Path) -> None:
    data = {"fleet": "farm", "note": 'line one\nline "two" \\ \'three\'', "broker": {"password": '"\n\t"'}}
    path = tmp_path / "x.toml"
    path.write_text(dump_toml(data))
    assert tomllib.loads(path.read_text()) == data


def test_the_broker_queues_a_burst_for_the_whole_fleet(tmp_path: Path) -> None:
    conf = write_fleet_setup("farm", [f"agent{i:03d}" for i in range(300)], tmp_path)["mosquitto.conf"].read_text()
    assert "max_queued_messages 60000" in conf and "use_username_as_clientid true" in conf
