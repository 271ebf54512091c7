"""How a fleet's missing clients are imputed (``twin`` of coordinator.toml and the simulations):
torch-free, so that a config is checked before the twins load. Adding a forecaster is one module
under ``coordinator/twins/`` plus one line in ``TWIN_FORECASTERS``."""

from __future__ import annotations

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

    @field_validator("twin")
    @classmethod
    def _known_twin(cls, name: str) -> str:
        return registered(name, TWIN_FORECASTERS, "twin forecaster")
