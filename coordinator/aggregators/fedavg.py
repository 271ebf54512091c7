"""FedAvg (McMahan et al.) over the shared parameters only, which makes it FedPer."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from coordinator.aggregators.base import Aggregator, ClientUpdate, TensorDict


class FedAvg(Aggregator):
    """theta_s <- sum_i w_i theta_s,i with w_i = |D_i| / sum_j |D_j| (FedQAPer Algorithm 2).

    Sums run in float64 and are cast back, so the result does not depend on update order
    beyond float64 rounding.
    """

    name = "fedavg"

    def aggregate(self, updates: Sequence[ClientUpdate]) -> TensorDict:
        if not updates:
            raise ValueError("FedAvg needs at least one client update")
        total = sum(update.n_samples for update in updates)
        if total <= 0:
            raise ValueError("FedAvg needs a positive total sample count")
        names = updates[0].params.keys()
        result: TensorDict = {}
        for name in names:
            acc = torch.zeros_like(updates[0].params[name], dtype=torch.float64)
            for update in updates:
                acc += update.params[name].to(torch.float64) * (update.n_samples / total)
            result[name] = acc.to(updates[0].params[name].dtype)
        return result
