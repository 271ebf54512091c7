"""Moving-average forecasting (FedDTW section 2.2.1, eq. 2)."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.twins.base import TensorDict, TwinForecaster


class MovingAverage(TwinForecaster):
    """theta_hat_t = (1/n) sum_{k=1..n} theta_{t-k}; fewer terms while the history is short."""

    name = "maf"
    window = 2

    def __init__(self, n: int = 2):
        if n < 1:
            raise ValueError(f"maf window n must be >= 1, got {n}")
        self.n = n

    def forecast(self, history: Sequence[TensorDict]) -> TensorDict | None:
        recent = list(history)[-self.n :]
        if not recent:
            return None
        return {name: sum(state[name] for state in recent) / len(recent) for name in recent[-1]}
