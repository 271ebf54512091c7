"""Digital twins of clients (FedDTW): forecasters registry and the bounded history store.

Adding a forecaster is one module plus one line in ``TWIN_FORECASTERS``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from coordinator.twins.base import TensorDict, TwinForecaster
from coordinator.twins.drop import Drop
from coordinator.twins.history import TwinHistory
from coordinator.twins.impute import Imputation, impute_missing
from coordinator.twins.maf import MovingAverage
from coordinator.twins.stale import Stale
from coordinator.twins.wsf import WeightedSmoothing
from edge_agent.registry import registered

TWIN_FORECASTERS: dict[str, type[TwinForecaster]] = {
    Drop.name: Drop,
    Stale.name: Stale,
    MovingAverage.name: MovingAverage,
    WeightedSmoothing.name: WeightedSmoothing,
}


def make_forecaster(name: str) -> TwinForecaster:
    """Instantiate a registered forecaster with its paper defaults, or fail listing the names."""
    return TWIN_FORECASTERS[registered(name, TWIN_FORECASTERS, "twin forecaster")]()


class TwinSettings(BaseModel):
    """How missing clients are handled: the same fields in simulations and ``coordinator.toml``."""

    twin: str = Field("drop", description=f"how missing clients are imputed: {sorted(TWIN_FORECASTERS)}")
    twin_max_age: int | None = Field(None, ge=1, description="impute only clients seen within this many rounds")
    late_updates: Literal["next_round", "history"] = Field(
        "next_round", description="next_round: a late update stands in for its client in the next close where the "
        "client has no on-time update (its delta applied to the current global, weight n_samples/sqrt(1+rounds "
        "late)), else its twin; history: twin history only (FedDTW's delayed-update scenario)")

    @field_validator("twin")
    @classmethod
    def _known_twin(cls, name: str) -> str:
        return registered(name, TWIN_FORECASTERS, "twin forecaster")


__all__ = [
    "TWIN_FORECASTERS", "Imputation", "TensorDict", "TwinForecaster", "TwinHistory", "TwinSettings",
    "impute_missing", "make_forecaster",
]
