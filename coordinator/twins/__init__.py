"""Digital twins of clients (FedDTW): forecasters registry and the bounded history store.

Adding a forecaster is one module plus one line in ``TWIN_FORECASTERS``.
"""

from __future__ import annotations

from coordinator.twins.base import TensorDict, TwinForecaster
from coordinator.twins.drop import Drop
from coordinator.twins.history import TwinHistory
from coordinator.twins.impute import Imputation, impute_missing
from coordinator.twins.maf import MovingAverage
from coordinator.twins.stale import Stale
from coordinator.twins.wsf import WeightedSmoothing

TWIN_FORECASTERS: dict[str, type[TwinForecaster]] = {
    Drop.name: Drop,
    Stale.name: Stale,
    MovingAverage.name: MovingAverage,
    WeightedSmoothing.name: WeightedSmoothing,
}


def make_forecaster(name: str) -> TwinForecaster:
    """Instantiate a registered forecaster with its paper defaults, or fail listing the names."""
    try:
        return TWIN_FORECASTERS[name]()
    except KeyError:
        raise ValueError(f"twin forecaster: unknown {name!r}; choose one of {sorted(TWIN_FORECASTERS)}") from None


__all__ = [
    "TWIN_FORECASTERS", "Imputation", "TensorDict", "TwinForecaster", "TwinHistory", "impute_missing",
    "make_forecaster",
]
