"""Who trains in a round and when the round may close: the round policy, the same in the
coordinator service and the simulation (the ``configure_train`` half of Flower's strategies).

Each round asks ``fraction`` of the eligible clients (online, allowed, not excluded), at least
``min_clients`` and at most ``MAX_PARTICIPANTS`` of them (the ids travel in the announcement),
drawn without replacement from the run's participation stream (seeded by fleet seed and round,
so the coordinator and a simulation of the same roster draw the same clients). A round closes
when every participant reported; or once ``quorum`` of them reported and a grace period passed,
``grace`` times the time the quorum took (so a silent device delays a round by at most that
share); or at the deadline. A client that missed ``exclude_after`` rounds in a row it was asked
to is not asked again until it sends a message (a hello or a late update): a device that keeps
its retained ``online`` and never sends cannot stall the fleet.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.strategy_settings import ParticipationSettings
from edge_agent.protocol import MAX_PARTICIPANTS
from edge_agent.seeds import Stream, seed_for


@dataclass(frozen=True)
class Progress:
    """Where an open round stands: updates on time, participants still expected (online, not yet
    reported), when it was announced and when it first had its quorum (None: not yet)."""

    reported: int
    waiting: int
    opened_at: float
    quorum_at: float | None


class RoundPolicy:
    """Chooses each round's participants and decides when a round may close."""

    def __init__(self, settings: ParticipationSettings, min_clients: int, seed: int):
        self.settings, self.min_clients, self.seed = settings, min_clients, seed

    def participants(self, round_number: int, eligible: Iterable[str]) -> list[str]:
        """The clients asked to train in ``round_number`` (sorted), drawn from ``eligible``."""
        pool = sorted(eligible)
        if not self.settings.sampling:
            return pool
        count = min(len(pool), MAX_PARTICIPANTS, max(self.min_clients, math.ceil(self.settings.fraction * len(pool))))
        rng = np.random.default_rng(seed_for(self.seed, Stream.PARTICIPATION, round_number))
        return sorted(pool[i] for i in rng.choice(len(pool), count, replace=False))

    def quorum(self, participants: int) -> int:
        """Updates needed before the grace period starts."""
        return max(self.min_clients, math.ceil(self.settings.quorum * participants))

    def close_reason(self, progress: Progress, participants: int, deadline: float, now: float) -> str | None:
        """Why the round closes now, or None while it stays open (the deadline without
        ``min_clients`` updates extends the round: not a close)."""
        if progress.reported < self.min_clients:
            return None
        if progress.waiting == 0:
            return "all participants reported"
        if progress.quorum_at is not None and progress.reported >= self.quorum(participants):
            grace = self.settings.grace * max(progress.quorum_at - progress.opened_at, 0.0)
            if now >= progress.quorum_at + grace:
                return "quorum + grace"
        return "deadline" if now >= deadline else None

    def missed(self, rounds: Sequence[tuple[Sequence[str], Sequence[str]]],
               before: dict[str, int] | None = None) -> dict[str, int]:
        """Rounds missed in a row per client after closed rounds' (asked, reported) in order,
        continuing the streaks ``before``."""
        streak = dict(before or {})
        for asked, on_time in rounds:
            reported = set(on_time)
            for client in asked:
                streak[client] = 0 if client in reported else streak.get(client, 0) + 1
        return {client: count for client, count in streak.items() if count}

    def excluded(self, missed: dict[str, int]) -> set[str]:
        """The clients not asked any more (until they send a message)."""
        return {client for client, count in missed.items() if count >= self.settings.exclude_after}
