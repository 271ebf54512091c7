"""The refusal backoff's rules, shared by the edge agent and the site aggregator: when a refused
client introduces itself again, when it gives up, and which answers end an update's resending."""

from __future__ import annotations

import time

import pytest

from edge_agent.refusals import RESEND_MAY_HELP, RefusalBackoff, Refused, settled


def scheduled_delay(backoff: RefusalBackoff) -> float:
    assert backoff.timer.due_at is not None
    return backoff.timer.due_at - time.monotonic()


def test_the_backoff_doubles_with_equal_jitter_and_one_introduction_shares_one_delay() -> None:
    backoff = RefusalBackoff("gw", base_s=2.0, cap_s=16.0, seed=1)
    for ceiling in (2.0, 4.0, 8.0, 16.0, 16.0):
        backoff.refused("unknown_client", "hello", "send hello first")
        backoff.refused("unknown_client", "update", "send hello first")  # the same introduction's answer
        delay = scheduled_delay(backoff)
        assert ceiling / 2 - 0.01 <= delay <= ceiling
        backoff.timer.due_at = 0.0
        assert backoff.due() and not backoff.due()
    assert backoff.timer.failures == 5
    backoff.refused("unknown_client", "update", "send hello first")
    backoff.accepted()  # the hello's answer: the update's reintroduction still goes out
    assert backoff.timer.failures == 0 and backoff.timer.due_at is not None and not backoff.shut_out


def test_terminal_refusals_stop_training_and_give_up_only_after_the_grace_time() -> None:
    backoff = RefusalBackoff("gw", max_terminal=2, give_up_after_s=0.0, seed=1)
    backoff.refused("not_allowed", "hello", "revoked")
    assert backoff.shut_out
    with pytest.raises(Refused, match="not_allowed"):
        backoff.refused("not_allowed", "hello", "revoked")
    patient = RefusalBackoff("gw", max_terminal=2, give_up_after_s=3600.0, seed=1)
    for _ in range(5):
        patient.refused("bad_signature", "hello", "another model")  # an operator may still fix it
    assert patient.shut_out


@pytest.mark.parametrize("code", ["duplicate", "forgotten_round", "unknown_round", "replay", "not_asked",
                                  "wrong_campaign", "bad_body", "not_finite", "truncated"])
def test_an_update_refused_for_good_is_not_sent_again(code: str) -> None:
    assert settled(False, code)
    backoff = RefusalBackoff("gw", seed=1)
    backoff.refused(code, "update", "final")  # a refusal of one message: no backoff, no give-up
    assert backoff.timer.due_at is None and not backoff.shut_out


@pytest.mark.parametrize("code", sorted(RESEND_MAY_HELP))
def test_an_update_refused_for_a_reason_that_can_pass_is_kept_for_the_next_introduction(code: str) -> None:
    assert not settled(False, code) and settled(True, "")
