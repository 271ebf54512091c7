"""Who a round asks: named up to 900 clients, by digest beyond, exact for members and bounded for
hostile announcements."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from coordinator.strategies.participation import RoundPolicy
from coordinator.strategy_settings import ParticipationSettings
from edge_agent.asked import ASKED_DIGEST_BYTES, MAX_ASKED, MAX_PARTICIPANTS, announced, asked_digest
from edge_agent.protocol import MAX_HEADER_BYTES, RoundHeader, decode, encode


def announcement(**fields) -> RoundHeader:
    return RoundHeader(fleet="farm", sender="coordinator", round=3, deadline_unix=1e9, model_signature="f" * 64,
                       campaign="c" * 64, **fields)


def test_up_to_900_clients_are_named_and_beyond_they_travel_as_digests_that_fit_one_header() -> None:
    few = [f"gw{i:05d}" for i in range(MAX_PARTICIPANTS)]
    assert announced(few) == {"participants": few}
    many = [f"c{i:063d}" for i in range(MAX_ASKED)]
    header = announcement(**announced(many))
    assert header.participants is None and header.asked_count == MAX_ASKED
    wire = encode(header)
    assert len(wire) < MAX_HEADER_BYTES
    received, _ = decode(wire, len(wire))
    outsiders = [f"d{i:063d}" for i in range(20_000)]
    assert all(received.asks(c) for c in many) and not any(received.asks(c) for c in outsiders)
    assert announcement().asks("anyone") and announcement().asked_count is None
    with pytest.raises(ValueError, match=f"at most {MAX_ASKED}"):
        announced(many + ["one-more"])


@pytest.mark.parametrize(("asked", "reason"), [
    ("not base64!", "not base64"),
    (base64.b64encode(b"x" * (ASKED_DIGEST_BYTES + 1)).decode(), "whole number"),
    ("A" * (4 * MAX_ASKED * ASKED_DIGEST_BYTES // 3 + 4), "at most"),
])
def test_a_malformed_digest_list_is_refused_with_its_reason(asked: str, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        announcement(asked=asked)


def test_a_round_cannot_name_its_participants_and_give_digests_at_once() -> None:
    with pytest.raises(ValidationError, match="not both"):
        announcement(participants=["a"], asked=base64.b64encode(asked_digest("a")).decode())


def test_the_round_policy_asks_beyond_900_up_to_the_digest_bound() -> None:
    fleet = [f"gw{i:05d}" for i in range(8000)]
    policy = RoundPolicy(ParticipationSettings(fraction=0.5), 1, 7)
    assert len(policy.participants(1, fleet)) == 4000
    assert len(RoundPolicy(ParticipationSettings(fraction=0.99), 1, 7).participants(1, fleet)) == MAX_ASKED
