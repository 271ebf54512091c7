"""The one backoff timer (``edge_agent.backoff``) with the coordinator's storage retry numbers: no
jitter, a pause doubling to its cap, and a success that makes the next try due at once. The
jittered use and the reset that keeps a scheduled try are in ``tests/test_refusals.py``."""

from __future__ import annotations

import time

from edge_agent.backoff import Backoff


def test_without_jitter_the_pause_doubles_to_the_cap_and_a_success_makes_the_next_try_due() -> None:
    timer = Backoff(base_s=0.5, cap_s=2.0)
    assert not timer.waiting() and not timer.take_due()
    assert [timer.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 2.0]
    assert timer.waiting() and timer.failures == 4
    timer.reset()
    assert timer.failures == 0 and not timer.waiting() and timer.failed() == 0.5


def test_wait_sleeps_until_the_try_is_due_but_no_longer_than_one_turn() -> None:
    timer = Backoff(base_s=60.0, cap_s=60.0)
    started = time.monotonic()
    timer.wait(1.0)  # nothing scheduled: no sleep
    timer.failed()
    timer.wait(0.05)
    assert 0.04 <= time.monotonic() - started < 1.0 and timer.waiting()
