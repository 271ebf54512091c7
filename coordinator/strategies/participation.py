"""Who trains in a round and when the round may close: the round policy, the same in the
coordinator service and the simulation (the ``configure_train`` half of Flower's strategies).

Each round asks ``fraction`` of the eligible clients (online, allowed, not excluded), at least
``min_clients`` and at most ``MAX_ASKED`` of them (named in the announcement, or beyond
``MAX_PARTICIPANTS`` given by digest: ``edge_agent.asked``),
drawn without replacement from the run's participation stream (seeded by fleet seed and round,
so the coordinator and a simulation of the same roster draw the same clients). A round closes
when every participant reported; or once ``quorum`` of them reported (from 3 participants on at
most all but one unless ``quorum = 1``, so one straggler does not hold a small fleet to the
deadline) and a grace period
passed, ``grace`` times the time the quorum took; or at the deadline; never with fewer than
``min_clients`` on-time updates, counted after the screen. The buffered policy (FedBuff) closes
a round instead once its on-time updates and the late ones held for its close reach the buffer's
K (or when every participant reported, or at the deadline). A client that missed
``exclude_after`` rounds in a row it was asked to is left out for ``exclude_after`` rounds, then
asked once more; each further miss doubles the time out. Only an on-time update that reaches the
close clears that record: a hello or a late update does not, so a device that keeps its retained
``online`` and never sends on time cannot stall the fleet, however often it says hello."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from coordinator.strategy_settings import ParticipationSettings
from edge_agent.asked import MAX_ASKED
from edge_agent.protocol import MAX_ROUND
from edge_agent.seeds import Stream, seed_for


STRAGGLER_FROM = 3  # from this many participants on, the quorum leaves one of them out


@dataclass(frozen=True)
class Standing:
    """A client's record of missed rounds: how many in a row it was asked to and missed, how many
    times it was left out since its last on-time update, and the first round it may be asked again."""

    missed: int = 0
    strikes: int = 0
    back: int = 0


@dataclass(frozen=True)
class Progress:
    """Where an open round stands: updates on time, participants still expected (online, not yet
    reported), when it was announced and when it first had its quorum (None: not yet)."""

    reported: int
    waiting: int
    opened_at: float
    quorum_at: float | None
    held: int = 0  # late updates of earlier rounds that will enter this close (the buffered policy's)


class RoundPolicy:
    """Chooses each round's participants and decides when a round may close."""

    def __init__(self, settings: ParticipationSettings, min_clients: int, seed: int):
        self.settings, self.min_clients, self.seed = settings, min_clients, seed

    def participants(self, round_number: int, eligible: Iterable[str]) -> list[str]:
        """The clients asked to train in ``round_number`` (sorted), drawn from ``eligible``."""
        pool = sorted(eligible)
        if not self.settings.sampling:
            return pool
        count = min(len(pool), MAX_ASKED, max(self.min_clients, math.ceil(self.settings.fraction * len(pool))))
        rng = np.random.default_rng(seed_for(self.seed, Stream.PARTICIPATION, round_number))
        return sorted(pool[i] for i in rng.choice(len(pool), count, replace=False))

    def quorum(self, participants: int) -> int:
        """Updates needed before the grace period starts: ``quorum`` of the participants rounded
        up, from ``STRAGGLER_FROM`` participants on at most all but one (unless ``quorum`` is 1:
        wait for all), never below ``min_clients``."""
        share = math.ceil(self.settings.quorum * participants)
        if participants >= STRAGGLER_FROM and self.settings.quorum < 1.0:
            share = min(share, participants - 1)
        return max(self.min_clients, share)

    def buffer_size(self, participants: int) -> int:
        """K of the buffered policy: the buffer's ``size``, else the quorum's count."""
        size = self.settings.buffer.size
        return self.quorum(participants) if size is None else size

    def close_reason(self, progress: Progress, participants: int, deadline: float, now: float) -> str | None:
        """Why the round closes now, or None while it stays open (the deadline without
        ``min_clients`` updates extends the round: not a close)."""
        if progress.reported < self.min_clients:
            return None
        if progress.reported == 0:  # min_clients = 0: a round nobody reported in waits for its deadline
            return "deadline" if now >= deadline else None
        if progress.waiting == 0:
            return "all participants reported"
        if self.settings.buffering is not None:
            if progress.reported + progress.held >= self.buffer_size(participants):
                return "buffer full"
        elif progress.quorum_at is not None and progress.reported >= self.quorum(participants):
            grace = self.settings.grace * max(progress.quorum_at - progress.opened_at, 0.0)
            if now >= progress.quorum_at + grace:
                return "quorum + grace"
        return "deadline" if now >= deadline else None

    def standings(self, rounds: Sequence[tuple[int, Sequence[str], Sequence[str]]],
                  before: dict[str, Standing] | None = None) -> dict[str, Standing]:
        """The clients' records after closed rounds' (number, asked, reported on time), in order,
        continuing ``before``: an on-time update clears a record (asked or not), a miss adds to it."""
        standing = dict(before or {})
        for number, asked, on_time in rounds:
            for client in on_time:
                standing.pop(client, None)
            for client in set(asked) - set(on_time):
                standing[client] = self._missed(number, standing.get(client, Standing()))
        return standing

    def _missed(self, number: int, record: Standing) -> Standing:
        """A client's record after it missed round ``number``: from ``exclude_after`` misses in a
        row on, left out for ``exclude_after`` rounds, twice as long after each further miss."""
        missed = record.missed + 1
        if missed < self.settings.exclude_after:
            return Standing(missed, record.strikes, record.back)
        out = min(self.settings.exclude_after * 2 ** record.strikes, MAX_ROUND)
        return Standing(missed, record.strikes + 1, number + 1 + out)

    def excluded(self, standing: dict[str, Standing], round_number: int) -> set[str]:
        """The clients not asked in ``round_number``."""
        return {client for client, record in standing.items() if record.back > round_number}
