"""No twin: a missing client is left out (plain FedAvg over the present clients)."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.twins.base import TensorDict, TwinForecaster


class Drop(TwinForecaster):
    """Never imputes."""

    name = "drop"
    window = 0

    def forecast(self, history: Sequence[TensorDict]) -> TensorDict | None:
        return None
