"""The service side of the round policy (``coordinator.strategies.participation``): who the open
round asked, kept in the store so a restarted coordinator asks the same clients; how far the
round has come (what the screen left out of a close attempt does not count); and each client's
record of missed rounds (``Standing``), kept in the store with each close."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass

from coordinator.access import Access
from coordinator.engine import TooFewScreened
from coordinator.store import RoundRow, Store
from coordinator.strategies import RoundPolicy
from coordinator.strategies.participation import Progress, Standing

log = logging.getLogger("edgefl.coordinator")
ASKED = "asked"  # store meta: the open round's participants, as first announced
STANDING = "standing"  # store meta: each client's record of missed rounds as of the last close
PROGRESS_EVERY_S = 0.5  # without new messages, a round's progress is read from the store this often


@dataclass
class OpenRound:
    """The round on the broker: its participants, when it was announced (or resumed) and when it
    first had its quorum."""

    round: int
    asked: frozenset[str]
    opened_at: float
    quorum_at: float | None = None
    progress: Progress | None = None  # as last read from the store
    read_at: float = 0.0
    left_out: frozenset[str] = frozenset()  # on-time updates the screen left out of a close attempt


class Participants:
    """The open round's participants and progress, and the clients' records of missed rounds."""

    def __init__(self, policy: RoundPolicy, store: Store, access: Access,
                 held: Callable[[int], Sequence[str]] = lambda _: ()):
        """``held``: the clients whose late updates a round's buffered close would take (the engine's)."""
        self.policy, self.store, self.access, self.held = policy, store, access, held
        self._open: OpenRound | None = None
        self.standing = self._saved_standing()

    def _saved_standing(self) -> dict[str, Standing]:
        """The records as of the last close; a store from before they were kept: folded from its
        last ``exclude_after`` closed rounds."""
        saved = self.store.meta(STANDING)
        if saved is not None:
            return {client: Standing(*fields) for client, fields in json.loads(saved).items()}
        rows = self.store.closed_rounds(self.policy.settings.exclude_after)
        return self.policy.standings([(r.round, r.metrics.get("asked", []), r.metrics.get("reported", []))
                                      for r in rows])

    @property
    def sampling(self) -> bool:
        return self.policy.settings.sampling

    def of(self, row: RoundRow) -> OpenRound:
        """The open round's state: its participants as first announced, else drawn now by the
        round policy from the eligible clients (online, allowed, not excluded)."""
        if self._open is not None and self._open.round == row.round:
            return self._open
        saved = json.loads(self.store.meta(ASKED) or "null")
        if saved is not None and saved["round"] == row.round:
            asked = saved["clients"]
        else:
            excluded = self.policy.excluded(self.standing, row.round)
            eligible = [c for c in self.store.online_clients() if self.access.allows(c) and c not in excluded]
            asked = self.policy.participants(row.round, eligible)
            with self.store.savepoint():
                self.store.set_meta(ASKED, json.dumps({"round": row.round, "clients": asked}))
            if excluded:
                log.info("round %d: not asking %d clients that missed %d or more rounds in a row: %s", row.round,
                         len(excluded), self.policy.settings.exclude_after, sorted(excluded)[:20])
        self._open = OpenRound(row.round, frozenset(asked), self.store.clock())
        return self._open

    def named(self, row: RoundRow) -> list[str] | None:
        """The participants a round's announcement names (None: every client trains)."""
        return sorted(self.of(row).asked) if self.sampling else None

    def takes_part(self, row: RoundRow, client: str) -> bool:
        """Whether ``client`` belongs in the round's close (every client unless the policy samples)."""
        return not self.sampling or client in self.of(row).asked

    def close_reason(self, row: RoundRow, fresh: bool) -> tuple[Progress, str | None]:
        """The round's progress and why it closes now (None: it stays open)."""
        state = self.of(row)
        progress = self._progress(row, state, fresh)
        return progress, self.policy.close_reason(progress, len(state.asked), row.deadline, self.store.clock())

    def _progress(self, row: RoundRow, state: OpenRound, fresh: bool) -> Progress:
        """Read again after new messages (``fresh``) or every ``PROGRESS_EVERY_S``: who is still
        expected is every participant online without an update (with ``fraction = 1``: every
        allowed online client not excluded, joiners too); updates the screen left out do not count;
        the held late updates of clients without an on-time update count for the buffered policy."""
        now = self.store.clock()
        if state.progress is not None and not fresh and now - state.read_at < PROGRESS_EVERY_S:
            return state.progress
        stored, pending = self.store.quorum_state(row.round)
        reported = stored - len(state.left_out)
        if self.sampling:
            expected = pending & state.asked
        else:
            excluded = self.policy.excluded(self.standing, row.round)
            expected = {c for c in pending if c not in excluded and self.access.allows(c)}
        if state.quorum_at is None and reported >= self.policy.quorum(len(state.asked)):
            state.quorum_at = now
        held = sum(not self.store.has_update(row.round, c) for c in self.held(row.round))
        state.progress, state.read_at = Progress(reported, len(expected), state.opened_at, state.quorum_at, held), now
        return state.progress

    def left_out(self, row: RoundRow, clients: set[str], short: TooFewScreened) -> None:
        """A close attempt's screen left out these clients' on-time updates (``short``): they do
        not count toward ``min_clients`` or the quorum any more, the round waits for others."""
        state = self.of(row)
        state.left_out, state.progress = frozenset(clients), None
        log.warning("round %d: %s; not aggregated, waiting for more updates", row.round, short)

    def closed(self, row: RoundRow, reported: list[str]) -> dict:
        """A round closed with on-time updates from ``reported``: the records move on (kept in the
        store, in the close's transaction); returns what the round's metrics record of it."""
        asked = sorted(self.of(row).asked)
        self.standing = self.policy.standings([(row.round, asked, reported)], self.standing)
        self.store.set_meta(STANDING, json.dumps({c: astuple(r) for c, r in sorted(self.standing.items())}))
        return {"asked": asked, "reported": reported, "sampled": self.sampling}
