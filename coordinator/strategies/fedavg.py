"""FedAvg (McMahan et al.) over what clients upload: with FedPer heads (FedQAPer Algorithm 2) the
shared part only, in prompt mode prompts and shared layers (FedPoD Table 1's "prompts + FedAvg")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from edge_agent.tensors import TensorDict


class FedAvg(Strategy):
    """theta <- sum_i |D_i| / sum_j |D_j| theta_i over on-time and imputed updates."""

    name = "fedavg"

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        return Aggregate(weighted_mean([*on_time, *imputed]))
