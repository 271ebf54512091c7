"""The one transport seam (issue 47): ``MemoryTransport`` records what a service publishes and
acknowledges as a broker would see it, the MQTT ``Connection`` is the same ``Transport``, and a
coordinator runs its rounds over memory through the service loop's own methods, ``serve`` included."""

from __future__ import annotations

from pathlib import Path

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig
from edge_agent.broker_settings import BrokerConfig
from edge_agent.mqtt import Connection
from edge_agent.protocol import ReplyHeader, RoundHeader, decode
from edge_agent.toml_config import load_config
from edge_agent.transport import Incoming, MemoryBroker, MemoryTransport, Transport
from tests.fleet import coordinator_config
from tests.offline import TOPICS, fed, hello_of, message, offline_coordinator, resumed, transport_of, update_of


def announcements(transport: MemoryTransport) -> list[tuple[RoundHeader, bool]]:
    """Every round message published, decoded, with whether it was retained."""
    return [(decode(payload, 1 << 30)[0], retain) for topic, payload, retain in transport.published
            if topic == TOPICS.round]


def replies(transport: MemoryTransport) -> list[tuple[str, str, bool]]:
    """Every answer published on an agent's task topic: (client, what it was about, accepted)."""
    answers = []
    for topic, payload, _ in transport.published:
        header = decode(payload, 1 << 30)[0] if topic.endswith("/task") else None
        if isinstance(header, ReplyHeader):
            answers.append((topic.split("/")[-2], header.about, header.accepted))
    return answers


def test_a_memory_transport_keeps_order_and_records_what_goes_out_and_what_is_acknowledged() -> None:
    transport = MemoryTransport()
    sessions: list[str] = []
    transport.on_connected.append(lambda: sessions.append("up"))
    first, second = message("a", "hello", b"1"), message("b", "status", b"online")
    transport.deliver(first, second)
    assert transport.connected.is_set() and [transport.inbox.get_nowait() for _ in range(2)] == [first, second]
    transport.start()
    transport.start()
    assert sessions == ["up", "up"], "each session that comes up runs the callbacks, as on a broker's CONNACK"
    transport.publish("t/x", b"p")
    transport.ack(second)
    transport.stop("t/status")
    assert transport.published == [("t/x", b"p", False), ("t/status", b"offline", True)]
    assert transport.acked == [second] and not transport.connected.is_set()
    transport.stop("t/status")
    assert len(transport.published) == 2, "no goodbye without a session"


def test_the_mqtt_connection_and_the_memory_transport_are_both_transports() -> None:
    connection = Connection(BrokerConfig(port=free_port()), client_id="probe", will_topic="probe/status",
                            subscriptions=[])
    assert isinstance(connection, Transport) and isinstance(MemoryTransport(), Transport)
    assert not isinstance(object(), Transport)


def test_a_round_over_memory_answers_each_message_closes_and_announces_the_next_round_retained(
    tmp_path: Path
) -> None:
    coordinator = offline_coordinator(tmp_path, rounds=2)
    transport = transport_of(coordinator)
    transport.start()
    assert transport.published == [(TOPICS.coordinator_status, b"online", True)]
    assert fed(coordinator, hello_of(coordinator, "a"), hello_of(coordinator, "b"))
    assert fed(coordinator, update_of(coordinator, "a"), update_of(coordinator, "b"))
    following = coordinator.close_if_due(coordinator.store.round(1), fresh=coordinator.turn())  # as serve's loop
    assert following.round == 2 and coordinator.store.round(1).metrics["clients"] == ["a", "b"]
    assert replies(transport) == [("a", "hello", True), ("b", "hello", True), ("a", "update", True),
                                  ("b", "update", True)]
    [(header, retained)] = announcements(transport)
    assert (header.round, header.finished, header.campaign, retained) == (2, False, coordinator.campaign, True)
    assert len(transport.acked) == 4 and transport.inbox.empty()
    coordinator.store.close()


def test_serve_runs_a_whole_campaign_over_memory_and_says_goodbye(tmp_path: Path) -> None:
    """What two agents send waits in the inbox before ``serve`` starts: it registers them, takes
    their updates, closes the only round, announces the end and, once both said they went offline,
    publishes its own retained goodbye."""
    cfg = load_config(coordinator_config(tmp_path, free_port(), 1, linger_s=30.0), CoordinatorConfig)
    coordinator = resumed(cfg)  # round 1 open: what the updates are bound to
    sent: list[Incoming] = [*(hello_of(coordinator, c) for c in "ab"), *(update_of(coordinator, c) for c in "ab"),
                            *(message(c, "status", b"offline") for c in "ab")]
    transport = transport_of(coordinator)
    transport.deliver(*sent)
    coordinator.serve()
    assert [(h.round, h.finished, retained) for h, retained in announcements(transport)] == [
        (1, False, True), (1, True, True)]
    assert transport.published[0] == (TOPICS.coordinator_status, b"online", True)
    assert transport.published[-1] == (TOPICS.coordinator_status, b"offline", True)
    assert transport.acked == sent and not transport.connected.is_set()


def test_a_memory_broker_routes_by_topic_filter_and_keeps_the_last_retained_message() -> None:
    broker = MemoryBroker()
    agents, one = broker.session("edgefl/test/agents/+/hello"), broker.session("edgefl/test/#")
    agents.start()
    agents.publish("edgefl/test/round", b"r1", retain=True)
    agents.publish("edgefl/test/round", b"r2", retain=True)
    agents.publish("edgefl/test/agents/a/hello", b"hi")
    assert [(m.topic, m.payload) for m in agents.drain()] == [("edgefl/test/agents/a/hello", b"hi")]
    one.start()  # subscribes after the fact: the last retained round only, marked retained
    assert [(m.topic, m.payload, m.retain) for m in one.drain()] == [("edgefl/test/round", b"r2", True)]
    agents.publish("edgefl/test/round", b"", retain=True)  # an empty retained message clears the topic
    later = broker.session("edgefl/test/round")
    later.start()
    assert [m.payload for m in one.drain()] == [b""] and later.drain() == []
    one.stop("edgefl/test/agents/b/status")  # its own goodbye reaches it too (subscribed to it), then nothing
    assert [m.payload for m in one.drain()] == [b"offline"]
    agents.publish("edgefl/test/agents/b/hello", b"again")
    assert one.drain() == [] and broker.retained == {"edgefl/test/agents/b/status": b"offline"}

