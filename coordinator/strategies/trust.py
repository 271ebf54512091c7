"""Influence bounded over time: a per-client trust carried across rounds (issue 46).

The screen (``bounds``) limits what one update can do in one round; nothing there limits the sum
over rounds, so a device that reverses its delta below the norm bound and claims a large count
moves the model a little every round. Trust is an exponential average of each on-time update's
progress along the coordinate-wise median of the other updates' deltas (its cosine with that
median times its length in median delta norms): FLTrust's direction score (Cao et al. 2021,
"FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping", section 4.2, with the
others' median standing in for the server's root-data update), scaled by length because a longer
reversed delta does more harm, and averaged over rounds instead of thresholded per round: one
honest update against the median (4.5-11% of them on non-IID fleets, ``bench/direction_check.py``)
costs nothing, a client whose average stays against the fleet loses its weight. The median leaves
the scored update out: with 4 updates the median of all is the mean of the middle two, which an
extreme reversed update picks on its own side (its cosine with that median was +0.1 to +0.5 on the
bundled stations). The weight multiplier falls linearly from 1 at ``trust_full`` to 0 at
``trust_zero``, both below 0 because an honest client with unusual data averages near 0 (sideways,
not against); at ``trust_zero`` its updates and its twin's forecasts are left out (``low_trust``).
A new client starts at ``trust_prior``; its updates are still scored, so trust recovers as they
turn with the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import torch

from coordinator.strategies.base import ClientUpdate
from coordinator.strategies.bounds import floating_names
from edge_agent.tensors import TensorDict

LOW_TRUST = "low_trust"


def progress_along_others(current: TensorDict, updates: Sequence[ClientUpdate]) -> dict[str, float]:
    """Each update's delta from ``current`` projected on the direction of the coordinate-wise
    median of the other updates' deltas, in units of the round's median delta norm (the lower
    middle one for an even count); 0 where the others' median is zero."""
    count = len(updates)
    dots, own, others = (torch.zeros(count, dtype=torch.float64) for _ in range(3))
    for name in floating_names(current):
        base = current[name].double().flatten()
        deltas = torch.stack([u.params[name].double().flatten() - base for u in updates])
        ordered, order = deltas.sort(dim=0)
        rank = torch.empty_like(order).scatter_(0, order, torch.arange(count).unsqueeze(1).expand_as(order))
        middle = (without(ordered, rank, (count - 2) // 2) + without(ordered, rank, (count - 1) // 2)) / 2
        dots += (deltas * middle).sum(1)
        own += (deltas * deltas).sum(1)
        others += (middle * middle).sum(1)
    scale = others.sqrt() * float(own.sqrt().median()) if count else others
    return {u.client_id: float(dot / norm) if norm > 0 else 0.0 for u, dot, norm in zip(updates, dots, scale)}


def without(ordered: torch.Tensor, rank: torch.Tensor, j: int) -> torch.Tensor:
    """Per update and coordinate, the ``j``-th smallest value of the other updates: the ``j``-th of
    all where the update ranks above it, else the next."""
    return torch.where(rank > j, ordered[j], ordered[j + 1])


def scored(trust: Mapping[str, float], progress: Mapping[str, float], rate: float, prior: float) -> dict[str, float]:
    """The trust after a round: each scored client's average moves ``rate`` of the way to its
    round's progress (from ``prior`` for a client without a score); the others keep theirs."""
    return {**trust, **{client: (1 - rate) * trust.get(client, prior) + rate * step
                        for client, step in progress.items()}}


def multiplier(score: float, full: float, zero: float) -> float:
    """The share of its bounded weight a client keeps: 1 from ``full`` up, 0 at ``zero`` and below."""
    return min(1.0, max(0.0, (score - zero) / (full - zero)))


def weighed(updates: Iterable[ClientUpdate], shares: Mapping[str, float]) -> tuple[list[ClientUpdate], list[str], list[str]]:
    """``updates`` with their weights cut by their clients' ``shares`` (absent: 1): the updates
    kept, the clients left out (share 0) and those whose weight was cut."""
    kept, out, cut = [], [], []
    for update in updates:
        share = shares.get(update.client_id, 1.0)
        if share <= 0.0:
            out.append(update.client_id)
        elif share < 1.0:
            kept.append(replace(update, n_samples=max(1, int(update.n_samples * share))))
            cut.append(update.client_id)
        else:
            kept.append(update)
    return kept, out, cut


def latest_trust(metrics: Iterable[Mapping]) -> dict[str, float]:
    """The trust the newest closed round recorded (``metrics["trust"]``), from its rounds' metrics
    oldest first: what a resuming service carries on from; empty before any."""
    newest: dict[str, float] = {}
    for row in metrics:
        newest = {str(c): float(s) for c, s in row["trust"].items()} if "trust" in row else newest
    return newest
