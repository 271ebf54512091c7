"""Participation from training times: when each round of a simulated fleet closes under the
round policy, given how long each client takes to train, so that a simulation runs the buffered
policy (FedBuff) with the service's close rule (``RoundPolicy.close_reason``) and measures wall
time against synchronous rounds (bench/round_policy.py).

Every client is online; each round asks all but those the policy excludes for missed rounds
(``RoundPolicy.excluded``, as the service does: no round waits for them, their quorum counts
only the others), and every client trains. A client that is idle when a round opens
trains from that round's global state and reports after its duration; one still busy with an
earlier round reports that update late (it arrives during the round open then, held for that
round's close) and at once trains from the open round's state. Aggregation and transfers take no
time here: a round's wall time is how long it stayed open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.simulation.participation import Participation
from coordinator.strategies import RoundPolicy
from coordinator.strategies.participation import Progress, Standing

IDLE = float("inf")  # a client's next report time while it waits for the next round


@dataclass(frozen=True)
class Timed:
    """A timed run's participation and the time (seconds from the start) each round closed."""

    participation: Participation
    closed_at: tuple[float, ...]
    closed_by: tuple[str, ...]


@dataclass
class _Open:
    """The open round as the close rule sees it."""

    number: int
    opened_at: float
    deadline: float
    asked: int
    reported: set[int]
    held: set[int]
    waiting: set[int]
    quorum_at: float | None = None


def timed(policy: RoundPolicy, durations: Sequence[float], rounds: int, deadline_s: float) -> Timed:
    """The rounds of a fleet whose client i trains for ``durations[i]`` seconds, closed by
    ``policy`` with a deadline ``deadline_s`` after each announcement (extended by as much where
    it passes with fewer than ``min_clients`` updates, as the service does)."""
    n = len(durations)
    if n < policy.min_clients:
        raise ValueError(f"{n} clients can never make min_clients = {policy.min_clients}")
    present, late = np.zeros((rounds, n), np.int8), np.zeros((rounds, n), np.int8)
    arrival = np.zeros((rounds, n), np.int64)
    version, done_at = [1] * n, [float(d) for d in durations]  # the round each client trains for, and when it reports
    closed_at: list[float] = []
    closed_by: list[str] = []
    now = 0.0
    standing: dict[str, Standing] = {}  # each client's missed rounds, by its index
    for number in range(1, rounds + 1):
        excluded = policy.excluded(standing, number)
        asked = [i for i in range(n) if str(i) not in excluded]
        state = _Open(number, now, now + deadline_s, len(asked), set(), set(), set(asked))
        for i in range(n):
            if done_at[i] == IDLE:
                version[i], done_at[i] = number, now + durations[i]
        while True:
            upcoming = min(done_at)
            closed = _close_before(policy, state, upcoming, deadline_s)
            if closed is not None:
                now, why = closed
                break
            i = done_at.index(upcoming)
            if version[i] == number:
                present[number - 1, i], done_at[i] = 1, IDLE
                state.reported.add(i)
                state.held.discard(i)
                state.waiting.discard(i)
            else:
                late[version[i] - 1, i], arrival[version[i] - 1, i] = 1, number
                if number - version[i] <= _max_staleness(policy):
                    state.held.add(i)
                version[i], done_at[i] = number, upcoming + durations[i]
            if state.quorum_at is None and len(state.reported) >= policy.quorum(state.asked):
                state.quorum_at = upcoming
            why = _reason(policy, state, upcoming)
            if why is not None:
                now = upcoming
                break
        closed_at.append(now)
        closed_by.append(why)
        standing = policy.standings([(number, [str(i) for i in asked], [str(i) for i in state.reported])], standing)
    return Timed(Participation("timed", present, late, arrival), tuple(closed_at), tuple(closed_by))


def _max_staleness(policy: RoundPolicy) -> int:
    """How old a late update may be to count toward the buffer (none count for synchronous rounds)."""
    buffer = policy.settings.buffering
    return -1 if buffer is None else buffer.max_staleness


def _reason(policy: RoundPolicy, state: _Open, now: float) -> str | None:
    """Why the open round closes at ``now`` (None: it stays open)."""
    progress = Progress(len(state.reported), len(state.waiting), state.opened_at, state.quorum_at, len(state.held))
    return policy.close_reason(progress, state.asked, state.deadline, now)


def _close_before(policy: RoundPolicy, state: _Open, upcoming: float,
                  deadline_s: float) -> tuple[float, str] | None:
    """A close that comes before the next update arrives at ``upcoming``: the grace period's end
    or the deadline (which moves on by ``deadline_s`` where it finds too few updates)."""
    while True:
        times = [state.deadline]
        if state.quorum_at is not None:
            times.append(state.quorum_at + policy.settings.grace * (state.quorum_at - state.opened_at))
        due = [t for t in sorted(times) if t < upcoming]
        for t in due:
            why = _reason(policy, state, t)
            if why is not None:
                return t, why
        if state.deadline >= upcoming:
            return None
        state.deadline += deadline_s
