"""What every update must pass before any strategy sees it: the coordinator, not the device,
decides its weight and how far it may move the global state.

- Weight: an update's sample count is bounded by what its client declared at hello, by
  ``weight_factor`` times the median count the fleet declared at hello and by an optional
  fleet-wide cap, so ``n_samples = 10**12`` in an update buys no more weight than the hello did,
  and one in a hello no more than ``weight_factor`` typical clients.
- Finite values: an update holding NaN or infinity is rejected (code ``not_finite``).
- Norm: the delta of each update from the current global state is measured (L2 over the
  floating-point tensors); deltas beyond ``clip_factor`` times the round's median delta norm are
  scaled back to that norm (norm clipping as in McMahan et al. 2018, "Learning Differentially
  Private Recurrent Language Models", section 2, with an adaptive bound in the spirit of its
  median-based clipping), and updates beyond ``reject_factor`` times the median are rejected
  (code ``norm_outlier``). A client's pull on the weighted average, its weight times its delta
  norm, is bounded at ``clip_factor`` times the round's median pull by cutting its weight, so
  the weight cap and the norm clip cannot be stacked (``bound_pulls``). The median is a robust
  statistic as long as most updates are honest (Yin et al. 2018, "Byzantine-Robust Distributed
  Learning: Towards Optimal Statistical Rates").
- Direction: with ``min_cosine`` set, an update whose delta has a cosine below it with the round's
  coordinate-wise median delta is rejected (code ``against_median``), in rounds of at least 3
  updates. The median delta is the direction fewer than half of the updates cannot turn (Yin et
  al. 2018); scoring each update by its cosine with a trusted direction is FLTrust's (Cao et al.
  2021, "FLTrust: Byzantine-robust Federated Learning via Trust Bootstrapping"), with the median
  standing in for the server's root data. It catches a reversed delta of any length, so a device
  that stays below the norm screen and claims a large count (issue 27) no longer moves FedAvg.
  Off by default: honest deltas on non-IID fleets are close to orthogonal, so it rejects honest
  updates about as often as reversed ones (``bench/direction_check.py``, ``docs/security.md``).
- Over time: each client's trust, its updates' cosines with the median of the others' deltas
  averaged across rounds, cuts the weight of a client whose average stays against the fleet (the
  round engine, after this screen: ``trust``, opt-in with ``trust_rate``).

The checks run in the round engine, so the simulation and the service screen alike.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from coordinator.strategies.base import ClientInfo, ClientUpdate
from coordinator.strategy_settings import RobustSettings
from edge_agent.tensors import TensorDict, first_non_finite, flat64

NOT_FINITE, NORM_OUTLIER, UNREGISTERED, AGAINST_MEDIAN = "not_finite", "norm_outlier", "unregistered", "against_median"
MIN_DIRECTION_UPDATES = 3


@dataclass(frozen=True)
class Screened:
    """The updates that enter aggregation (weights bounded, deltas clipped, order kept), the
    rejected clients with their codes, the clipped ones and the round's median delta norm."""

    accepted: list[ClientUpdate]
    rejected: dict[str, str]
    clipped: tuple[str, ...]
    median_norm: float


def screen(current: TensorDict, updates: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo],
           settings: RobustSettings) -> Screened:
    """Bound the weights, reject non-finite updates and norm outliers, clip the rest. A median
    delta norm of zero or infinity gives no scale: then only weights and finiteness are checked."""
    rejected: dict[str, str] = {}
    finite, norms, cap = [], [], weight_cap(roster, settings)
    names = floating_names(current)
    base, inside = flat64(current, names), frozenset(names)
    for update in updates:
        if update.client_id not in roster:
            rejected[update.client_id] = UNREGISTERED
            continue
        vector = flat64(update.params, names)
        if not bool(vector.isfinite().all()) or first_non_finite(beyond(update.params, inside)) is not None:
            rejected[update.client_id] = NOT_FINITE
            continue
        site = update.client_id in settings.site_clients
        finite.append(bound_weight(update, roster[update.client_id].n_samples, math.inf if site else cap))
        norms.append(float(torch.linalg.vector_norm(vector - base)))
    median = statistics.median(norms) if norms else 0.0
    if not math.isfinite(median) or median == 0.0:
        return Screened(finite, rejected, (), median)
    check = settings.min_cosine is not None and len(finite) >= MIN_DIRECTION_UPDATES
    cosines = cosines_to_median(current, finite, names, norms) if check else [1.0] * len(finite)
    accepted, kept_norms, clipped = [], [], []
    for update, norm, cosine in zip(finite, norms, cosines):
        if settings.reject_factor is not None and norm > settings.reject_factor * median:
            rejected[update.client_id] = NORM_OUTLIER
            continue
        if check and cosine < settings.min_cosine:
            rejected[update.client_id] = AGAINST_MEDIAN
            continue
        if settings.clip_factor is not None and norm > settings.clip_factor * median:
            update = replace(update, params=scale_delta(current, update.params, settings.clip_factor * median / norm))
            clipped.append(update.client_id)
            norm = settings.clip_factor * median
        accepted.append(update)
        kept_norms.append(norm)
    if settings.clip_factor is not None:
        accepted, cut = bound_pulls(accepted, kept_norms, settings.clip_factor, frozenset(settings.site_clients))
        clipped += [client for client in cut if client not in clipped]
    return Screened(accepted, rejected, tuple(clipped), median)


def bound_pulls(updates: Sequence[ClientUpdate], norms: Sequence[float], factor: float,
                sites: frozenset[str]) -> tuple[list[ClientUpdate], list[str]]:
    """Cut the weight of an update whose pull on the weighted average (sample count times delta
    norm) exceeds ``factor`` times the median pull of the round's gateways, so that a large
    declared count and a large delta, each under its own bound, cannot multiply (issue 27's
    below-screen flip with an inflated hello: 3x weight at 3x norm). With equal counts this is
    the norm clip itself; site aggregators, whose weight is their gateways' sum, are exempt."""
    pulls = [u.n_samples * norm for u, norm in zip(updates, norms) if u.client_id not in sites]
    limit = factor * statistics.median(pulls) if pulls else 0.0
    if not math.isfinite(limit) or limit <= 0.0:
        return list(updates), []
    bounded, cut = [], []
    for update, norm in zip(updates, norms):
        if update.client_id not in sites and update.n_samples * norm > limit:
            update = replace(update, n_samples=max(1, int(limit / norm)))
            cut.append(update.client_id)
        bounded.append(update)
    return bounded, cut


def cosines_to_median(current: TensorDict, updates: Sequence[ClientUpdate], names: Sequence[str],
                      norms: Sequence[float]) -> list[float]:
    """Each update's cosine with the coordinate-wise median of the deltas (the mean of the two
    middle values for an even count), one tensor at a time so memory stays one tensor per update;
    1 for a zero delta or a zero median."""
    dots, squared = torch.zeros(len(updates), dtype=torch.float64), 0.0
    for name in names:
        base = current[name].double().flatten()
        deltas = torch.stack([u.params[name].double().flatten() - base for u in updates])
        ordered = deltas.sort(dim=0).values
        middle = (ordered[(len(updates) - 1) // 2] + ordered[len(updates) // 2]) / 2
        dots += deltas @ middle
        squared += float(middle @ middle)
    scale = math.sqrt(squared)
    return [float(dot) / (norm * scale) if norm > 0 and scale > 0 else 1.0 for dot, norm in zip(dots, norms)]


def weight_cap(roster: Mapping[str, ClientInfo], settings: RobustSettings) -> float:
    """The largest weight any update may carry: ``max_samples`` and ``weight_factor`` times the
    median count the clients other than sites declared, whichever is smaller (infinity with neither)."""
    caps = [math.inf if settings.max_samples is None else settings.max_samples]
    counts = [c.n_samples for c in roster.values() if c.client_id not in settings.site_clients]
    if settings.weight_factor is not None and counts:
        caps.append(settings.weight_factor * statistics.median(counts))
    return min(caps)


def bound_weight(update: ClientUpdate, declared: int, cap: float) -> ClientUpdate:
    """The update with its sample count bounded by the hello's count and the cap."""
    n = int(min(update.n_samples, declared, cap))
    return update if n == update.n_samples else replace(update, n_samples=n)


def floating_names(state: TensorDict) -> list[str]:
    """The floating tensors' names in name order: norms and dot products over several tensors sum
    in this order, so they are the same whatever order a state's dict was built in."""
    return sorted(name for name, tensor in state.items() if tensor.is_floating_point())


def beyond(params: TensorDict, inside: frozenset[str]) -> TensorDict:
    """The tensors of an update outside ``inside`` (what a client sends beyond the state, e.g. core-sets)."""
    return {name: tensor for name, tensor in params.items() if name not in inside}


def delta_norm(current: TensorDict, params: TensorDict) -> float:
    """L2 norm of ``params - current`` over the floating-point tensors, in float64."""
    names = floating_names(current)
    return float(torch.linalg.vector_norm(flat64(params, names) - flat64(current, names)))


def scale_delta(current: TensorDict, params: TensorDict, factor: float) -> TensorDict:
    """``current + factor * (params - current)`` on the floating-point tensors of the global
    state; others (and what an update carries beyond the state, e.g. core-sets) unchanged."""
    return {k: (current[k].double() + factor * (p.double() - current[k].double())).to(p.dtype)
            if k in current and p.is_floating_point() else p for k, p in params.items()}
