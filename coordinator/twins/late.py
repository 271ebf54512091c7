"""Late updates as stand-ins: an update that arrived after its round closed counts in the next
close where its client has no on-time update, in place of the client's twin. Its delta from the
global state it was trained from is applied to that close's global state and its weight falls
with its staleness t (rounds late) as FedBuff's s(t) = 1/sqrt(1 + t) (Nguyen et al., 2022). The
buffered round policy (``buffered``) keeps the weight and scales the change by s(t) instead, as
FedBuff's Algorithm 1 does, so a stale update moves the model less however few updates there are."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from coordinator.strategies.base import ClientUpdate
from coordinator.twins.base import TensorDict


@dataclass(frozen=True)
class Held:
    """A late update kept for the next close: the round it was trained for, its change to the
    global state, what it carries beyond the global state (core-sets), its count and metrics."""

    round: int
    delta: TensorDict
    extra: TensorDict
    n_samples: int
    metrics: dict[str, float] = field(default_factory=dict)


def staleness_weight(n_samples: int, rounds_late: int) -> int:
    """A stale update's sample weight: ``n_samples / sqrt(1 + rounds_late)``, at least 1."""
    return max(1, round(n_samples / math.sqrt(1 + max(rounds_late, 0))))


def staleness_scale(rounds_late: int, exponent: float) -> float:
    """FedBuff's staleness discount s(t) = (1 + t)^-a of an update ``rounds_late`` rounds old."""
    return (1.0 + max(rounds_late, 0)) ** -exponent


class LateUpdates:
    """The late updates received since the last close, the newest per client."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}

    def hold(self, update: ClientUpdate, round_number: int, trained_from: TensorDict) -> None:
        """Keep ``update`` for ``round_number``, trained from the global state ``trained_from``
        (a client's update for a later round replaces an earlier one)."""
        kept = self._held.get(update.client_id)
        if kept is not None and kept.round > round_number:
            return
        delta = {k: update.params[k] - trained_from[k] for k in trained_from if k in update.params}
        extra = {k: v for k, v in update.params.items() if k not in trained_from}
        self._held[update.client_id] = Held(round_number, delta, extra, update.n_samples, dict(update.metrics))

    def stand_ins(self, round_number: int, current: TensorDict, missing: Collection[str]) -> list[ClientUpdate]:
        """The held updates of the ``missing`` clients as updates of ``round_number`` from ``current``."""
        return [ClientUpdate(client, {**{k: current[k] + d for k, d in held.delta.items()}, **held.extra},
                             staleness_weight(held.n_samples, round_number - held.round), held.metrics)
                for client, held in sorted(self._held.items()) if client in missing]

    def usable(self, round_number: int, max_staleness: int) -> list[str]:
        """The clients whose held updates are at most ``max_staleness`` rounds old at the close
        of ``round_number`` (what a buffered close takes where they have no on-time update)."""
        return [client for client, held in sorted(self._held.items()) if round_number - held.round <= max_staleness]

    def buffered(self, round_number: int, current: TensorDict, clients: Collection[str],
                 exponent: float) -> list[ClientUpdate]:
        """The held updates of ``clients`` as updates of ``round_number`` from ``current``, each
        change scaled by ``staleness_scale``, each with its own sample count."""
        updates = []
        for client in sorted(clients):
            held = self._held[client]
            scale = staleness_scale(round_number - held.round, exponent)
            moved = {k: current[k] + (d if scale == 1.0 else (d * scale).to(d.dtype)) for k, d in held.delta.items()}
            updates.append(ClientUpdate(client, {**moved, **held.extra}, held.n_samples, held.metrics))
        return updates
