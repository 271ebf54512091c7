"""The one client side of the protocol (``edge_agent.protocol_client``), which the edge agent and
the site aggregator both use, driven over the in-memory transport: what a (re)connect, the
coordinator coming online, a refusal and its backoff make it send, and which replies end an
upload's re-sending."""

from __future__ import annotations

import pytest

from edge_agent.protocol import HelloHeader, ReplyHeader, decode
from edge_agent.protocol_client import ProtocolClient, settles_upload
from edge_agent.refusals import Refused, RefusalBackoff
from edge_agent.topics import Topics
from edge_agent.transport import MemoryTransport

FLEET, SENDER = "f", "gw1"
UPLOAD = b"an update's bytes"


def hello() -> HelloHeader:
    return HelloHeader(fleet=FLEET, sender=SENDER, n_features=3, n_samples=100, model_signature="0123456789abcdef")


def reply(accepted: bool, code: str = "", about: str = "update", round_index: int = 1) -> ReplyHeader:
    return ReplyHeader(fleet=FLEET, sender="coordinator", round=round_index, about=about, accepted=accepted,
                       code=code, reason="" if accepted else f"refused: {code}")


def client(registration=hello, uploads=lambda: [UPLOAD]) -> tuple[ProtocolClient, MemoryTransport]:
    transport = MemoryTransport()
    protocol = ProtocolClient(transport, Topics(FLEET), SENDER, RefusalBackoff(SENDER, seed=1, give_up_after_s=0.0),
                              registration, uploads)
    return protocol, transport


def sent(transport: MemoryTransport) -> list[str]:
    """What went out since the last call: the topic's last level, 'status=online' for presence."""
    out = [topic.rsplit("/", 1)[1] + (f"={payload.decode()}" if retain else "")
           for topic, payload, retain in transport.published]
    transport.published.clear()
    return out


def test_a_connect_says_online_then_the_loop_sends_the_hello_and_every_unanswered_upload() -> None:
    protocol, transport = client()
    transport.start()
    assert sent(transport) == ["status=online"]  # from the network thread: presence only
    protocol.tick()
    (hello_topic, payload, _), (update_topic, upload, _) = transport.published
    header, _ = decode(payload, 1 << 20)
    assert (hello_topic, header.sender, update_topic, upload) == ("edgefl/f/agents/gw1/hello", SENDER,
                                                                 "edgefl/f/agents/gw1/update", UPLOAD)
    assert sent(transport) == ["hello", "update"]
    protocol.tick()
    assert sent(transport) == []  # asked once, introduced once


def test_the_coordinator_coming_online_repeats_the_hello_only_and_asks_merge() -> None:
    protocol, transport = client()
    protocol.coordinator_status(b"offline")
    protocol.tick()
    assert sent(transport) == []
    protocol.coordinator_status(b"online")
    protocol.tick()
    assert sent(transport) == ["hello"]
    protocol.coordinator_status(b"online")
    transport.start()  # a reconnect before the loop came round: one introduction, with the uploads
    protocol.tick()
    assert sent(transport) == ["status=online", "hello", "update"]


def test_nothing_to_register_yet_sends_no_hello_but_still_the_uploads() -> None:
    protocol, transport = client(registration=lambda: None)
    protocol.introduce(resend=True)
    assert sent(transport) == ["update"]


def test_a_refusal_schedules_the_next_introduction_and_terminal_ones_give_up() -> None:
    protocol, transport = client()
    protocol.answered(reply(False, "unknown_client", about="hello", round_index=0))
    protocol.tick()
    assert sent(transport) == []  # the backoff's delay has not run out
    protocol.backoff.timer.due_at = 0.0
    protocol.tick()
    assert sent(transport) == ["hello", "update"]
    protocol.answered(reply(True, about="hello", round_index=0))
    assert protocol.backoff.terminal == []
    with pytest.raises(Refused):
        for _ in range(3):
            protocol.answered(reply(False, "not_allowed", about="hello", round_index=0))


@pytest.mark.parametrize(("accepted", "code", "about", "settles"), [
    (True, "", "update", True),
    (False, "duplicate", "update", True),  # taken before: nothing left to send
    (False, "late", "update", True),  # final for that update
    (False, "unknown_client", "update", False),  # taken once we are registered again
    (False, "not_allowed", "update", False),  # may be taken once an operator acted
    (True, "", "hello", False),
])
def test_which_replies_end_an_uploads_resending(accepted: bool, code: str, about: str, settles: bool) -> None:
    assert settles_upload(reply(accepted, code, about)) is settles
