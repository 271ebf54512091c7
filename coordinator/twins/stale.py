"""Reuse of the last observed state, the MIFA/FedVARP-style baseline."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.twins.base import TensorDict, TwinForecaster


class Stale(TwinForecaster):
    """theta_hat_t = theta_{t-1}."""

    name = "stale"
    window = 1

    def forecast(self, history: Sequence[TensorDict]) -> TensorDict | None:
        return {name: tensor.clone() for name, tensor in history[-1].items()} if history else None
