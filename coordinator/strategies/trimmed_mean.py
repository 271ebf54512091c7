"""Coordinate-wise trimmed mean (Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", Algorithm 1, option II): for every coordinate, sort the clients'
values, drop the ``beta`` share at each end and average the rest. With at most a ``beta`` share
of Byzantine clients, no poisoned value can pull the result outside the honest range. The paper
trims gradients; the states here all start from the same global state, so trimming the states
trims their deltas.
Sample counts are ignored on purpose: a device cannot buy influence by claiming more data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy
from coordinator.strategy_settings import StrategySettings
from edge_agent.tensors import TensorDict


def trimmed_mean(updates: Sequence[ClientUpdate], trim: int) -> TensorDict:
    """Per coordinate, the mean of the values left once the ``trim`` smallest and the ``trim``
    largest are dropped (float64, cast back; integer buffers rounded)."""
    if not updates or 2 * trim >= len(updates):
        raise ValueError(f"trimming {trim} from each end of {len(updates)} updates leaves nothing")
    result: TensorDict = {}
    for name, first in updates[0].params.items():
        ordered = torch.stack([u.params[name].to(torch.float64) for u in updates]).sort(dim=0).values
        kept = ordered[trim:len(updates) - trim].mean(dim=0)
        result[name] = kept.to(first.dtype) if first.is_floating_point() else kept.round().to(first.dtype)
    return result


class TrimmedMean(Strategy):
    """theta <- coordinate-wise mean of the on-time and imputed states, trimmed by
    ceil(beta n) from each end (always leaving at least one value)."""

    name = "trimmed_mean"

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(settings.robust.trim_fraction)

    def __init__(self, beta: float):
        self.beta = beta

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        updates = [*on_time, *imputed]
        return Aggregate(trimmed_mean(updates, min(math.ceil(self.beta * len(updates)), (len(updates) - 1) // 2)))
