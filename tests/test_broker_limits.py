"""Broker limits in the generated config (issue 46 item 7), run by a real mosquitto: a packet limit
derived from the fleet's model bounds what a device may retain, and the coordinator is neither
replayed nor moved by a device's retained hello or update."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from coordinator.broker_setup import MQTT_HEADERS, write_fleet_setup
from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator
from edge_agent.asked import MAX_ASKED, announced
from edge_agent.config import AgentConfig, FleetModel, load_config
from edge_agent.learners import fleet_template, largest_message
from edge_agent.limits import MAX_ROUND
from edge_agent.models import ModelConfig
from edge_agent.protocol import (
    MAX_METRICS,
    MAX_PARTICIPANTS,
    MAX_SAMPLES,
    PLACEHOLDER_DIGEST,
    HelloHeader,
    RoundHeader,
    UpdateHeader,
    encode,
    envelope_size,
)
from edge_agent.topics import Topics
from edge_agent.transport import MemoryTransport
from tests.broker import Mosquitto, free_port
from tests.offline import fed
from tests.test_broker_setup import collect, connect, device, password, wait_until

BIG = 30 * 1024 * 1024  # each of the three retained messages
TOPICS = Topics("farm")


def test_the_limit_is_the_largest_legal_message_of_the_fleets_model(tmp_path: Path) -> None:
    """Derived, not a constant: the largest update the protocol admits (every header field at its
    bound) and the coordinator's retained round naming 900 clients, or asking 6,000 by digest, fit; a model with twice the
    lookback gets a larger limit; 30 MB is far over it."""
    written = write_fleet_setup("farm", ["agent01"], tmp_path / "setup")
    cfg = load_config(written["coordinator.toml"], CoordinatorConfig)
    limit = cfg.max_payload_bytes
    assert load_config(written["agent01.toml"], AgentConfig).max_payload_bytes == limit == largest_message(cfg)
    assert f"max_packet_size {limit + MQTT_HEADERS}\n" in written["mosquitto.conf"].read_text()
    ids = [f"c{i:063d}" for i in range(MAX_PARTICIPANTS)]
    update = UpdateHeader(fleet="farm", sender=ids[0], round=MAX_ROUND, n_samples=MAX_SAMPLES, campaign="c" * 64,
                          global_sha256=PLACEHOLDER_DIGEST, metrics={name: -1e308 for name in ids[:MAX_METRICS]})
    announcements = [RoundHeader(fleet="farm", sender="coordinator", round=MAX_ROUND, deadline_unix=1e11,
                                 model_signature="f" * 64, campaign="c" * 64, **announced(asked))
                     for asked in (ids, [f"c{i:063d}" for i in range(MAX_ASKED)])]
    initial = fleet_template(cfg, cfg.seed).initial
    sizes = [envelope_size(header, initial) for header in (update, *announcements)]
    assert max(sizes) <= limit < BIG / 100
    assert largest_message(FleetModel(model=ModelConfig(lookback=2 * cfg.model.lookback))) > limit


def peak_memory_kb(broker: Mosquitto) -> int:
    """The broker process's peak resident memory (VmHWM), in kB."""
    status = Path(f"/proc/{broker.process.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


def retained(port: int, written: dict[str, Path], topic: str) -> bytes:
    """What a fresh subscriber to ``topic`` receives first: the message the broker retains there."""
    client, _ = connect(port, "coordinator", password(written, "coordinator"))
    try:
        inbox = collect(client, topic)
        wait_until(lambda: inbox, f"the retained message of {topic}", timeout=10)
        return inbox[0]
    finally:
        client.disconnect()
        client.loop_stop()


def test_a_retained_30_mb_message_on_a_device_topic_is_refused_by_the_generated_config(tmp_path: Path) -> None:
    """agent01, with its own credentials, leaves a legal retained hello, then sends 30 MB retained
    on the same topic (taken, it would replace the legal one). The broker refuses it at its fixed
    header, without buffering it: a live subscriber never gets it, a fresh one gets the legal hello,
    before and after a restart (its database never held it); a largest legal update goes through."""
    port = free_port()
    written = write_fleet_setup("farm", ["agent01"], tmp_path / "setup", port=port)
    limit = load_config(written["coordinator.toml"], CoordinatorConfig).max_payload_bytes
    broker = Mosquitto(tmp_path / "broker", port=port, config=written["mosquitto.conf"]).start()
    hello = TOPICS.agent("agent01", "hello")
    clients = []
    try:
        listener, _ = connect(port, "coordinator", password(written, "coordinator"))
        live = collect(listener, TOPICS.agents("hello"), TOPICS.agents("update"))
        attacker, dropped = device(port, written, "agent01")
        clients += [listener, attacker]
        attacker.publish(hello, b"legal", qos=1, retain=True).wait_for_publish(5)
        before = peak_memory_kb(broker)
        attacker.publish(hello, b"z" * BIG, qos=1, retain=True)
        assert dropped.wait(20), "the broker kept the connection that sent 30 MB"
        attacker.loop_stop()
        assert "agent01 disconnected due to oversize packet" in broker.log()
        assert peak_memory_kb(broker) - before < BIG / 1024 / 10  # under 3 MB: refused unread
        sender, _ = device(port, written, "agent01")
        clients.append(sender)
        sender.publish(TOPICS.agent("agent01", "update"), b"u" * limit, qos=1).wait_for_publish(10)
        wait_until(lambda: len(live) == 2, "the largest legal update")
        assert live == [b"legal", b"u" * limit]
        assert retained(port, written, hello) == b"legal"
        broker.stop()
        assert (tmp_path / "setup" / "data" / "mosquitto.db").stat().st_size < BIG / 100
        broker.start()
        assert retained(port, written, hello) == b"legal"
    finally:
        for client in clients:
            client.loop_stop()
        broker.stop()


def test_the_coordinator_is_not_replayed_retained_hellos_or_updates_and_ignores_them(tmp_path: Path) -> None:
    """A device leaves a retained hello, update and status: the coordinator's session, subscribing
    as at every start, gets the status (presence) and then live messages only; a retained hello
    that reaches it anyway (a broker without MQTT 5 retain handling) registers nothing."""
    port = free_port()
    written = write_fleet_setup("farm", ["agent01"], tmp_path / "setup", port=port)
    broker = Mosquitto(tmp_path / "broker", port=port, config=written["mosquitto.conf"]).start()
    cfg = load_config(written["coordinator.toml"], CoordinatorConfig)
    coordinator = Coordinator(cfg)  # over its own MQTT session, subscribed as the service is
    hello = encode(HelloHeader(fleet="farm", sender="agent01", n_features=1, n_samples=50,
                               model_signature=coordinator.signature))
    agent, _ = device(port, written, "agent01")
    try:
        for leaf, payload in (("hello", hello), ("update", b"stale"), ("status", b"online")):
            agent.publish(TOPICS.agent("agent01", leaf), payload, qos=1, retain=True).wait_for_publish(5)
        coordinator.transport.start()
        first = coordinator.transport.inbox.get(timeout=20)
        agent.publish(TOPICS.agent("agent01", "hello"), hello, qos=1).wait_for_publish(5)
        second = coordinator.transport.inbox.get(timeout=20)
    finally:
        coordinator.transport.stop()
        coordinator.store.close()
        agent.loop_stop()
        broker.stop()
    assert [(m.topic, m.retain) for m in (first, second)] == [(TOPICS.agent("agent01", "status"), True),
                                                              (TOPICS.agent("agent01", "hello"), False)]
    events: list[tuple[str, dict]] = []
    offline = Coordinator(cfg, on_event=lambda kind, data: events.append((kind, data)), transport=MemoryTransport())
    fed(offline, replace(second, retain=True))
    assert [data for kind, data in events if kind == "ignored"] == [
        {"client": "agent01", "topic": TOPICS.agent("agent01", "hello"), "why": "retained"}]
    assert "agent01" not in offline.store.clients()
    fed(offline, second)
    assert "agent01" in offline.store.clients()
    offline.store.close()
