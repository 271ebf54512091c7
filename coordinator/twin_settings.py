"""How a fleet's missing clients are imputed (``twin`` of coordinator.toml and the simulations):
torch-free, so that a config is checked before the twins load. Adding a forecaster is one module
under ``coordinator/twins/`` plus one line in ``TWIN_FORECASTERS``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator

from edge_agent.registry import LazyRegistry, registered

TWIN_FORECASTERS: LazyRegistry[type] = LazyRegistry("coordinator.twins", {  # coordinator.twins.base.TwinForecaster each
    "drop": "drop:Drop",
    "stale": "stale:Stale",
    "maf": "maf:MovingAverage",
    "wsf": "wsf:WeightedSmoothing",
})


class TwinSettings(BaseModel):
    """How missing clients are handled: the same fields in simulations and ``coordinator.toml``."""

    twin: str = Field("drop", description=f"how missing clients are imputed: {sorted(TWIN_FORECASTERS)}")
    twin_max_age: int | None = Field(None, ge=1, description="impute only clients seen within this many rounds")
    late_updates: Literal["next_round", "history"] = Field(
        "next_round", description="next_round: a late update stands in for its client in the next close where the "
        "client has no on-time update (its delta applied to the current global, weight n_samples/sqrt(1+rounds "
        "late)), else its twin; history: twin history only (FedDTW's delayed-update scenario); the buffered round "
        "policy (participation.policy) holds every late update whatever this says")

    @field_validator("twin")
    @classmethod
    def _known_twin(cls, name: str) -> str:
        return registered(name, TWIN_FORECASTERS, "twin forecaster")
