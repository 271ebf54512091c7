"""Weighted smoothing forecasting (FedDTW section 2.2.2, eq. 3)."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.twins.base import TensorDict, TwinForecaster


class WeightedSmoothing(TwinForecaster):
    """theta_hat_t = alpha theta_{t-1} + (1 - alpha) theta_{t-2} + (theta_{t-1} - theta_{t-2}).

    With a single observed state there is no trend to extrapolate: the forecast is that state.
    """

    name = "wsf"
    window = 2

    def __init__(self, alpha: float = 0.8):
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"wsf alpha must be in (0, 1), got {alpha}")
        self.alpha = alpha

    def forecast(self, history: Sequence[TensorDict]) -> TensorDict | None:
        if not history:
            return None
        last = history[-1]
        if len(history) == 1:
            return {name: tensor.clone() for name, tensor in last.items()}
        before = history[-2]
        return {
            name: self.alpha * last[name] + (1 - self.alpha) * before[name] + (last[name] - before[name])
            for name in last
        }
