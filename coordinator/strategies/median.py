"""Coordinate-wise median (Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards
Optimal Statistical Rates", Algorithm 1, option I): every coordinate of the next global state is
the median of the clients' values, so fewer than half of the clients cannot move it outside the
range of the honest ones, whatever they send. Sample counts are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy
from coordinator.strategies.trimmed_mean import trimmed_mean
from edge_agent.tensors import TensorDict


class Median(Strategy):
    """theta <- coordinate-wise median of the on-time and imputed states (the mean of the two
    middle values for an even count): the trimmed mean with all but the middle trimmed."""

    name = "median"

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        updates = [*on_time, *imputed]
        return Aggregate(trimmed_mean(updates, (len(updates) - 1) // 2))
