"""``edgefl simulate``'s federation settings (rounds, local training, strategy, twins): torch-free,
so that the command checks its options before the simulation (``coordinator.simulation.federation``) loads."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from coordinator.strategy_settings import StrategySettings
from coordinator.twin_settings import TwinSettings
from edge_agent.training_settings import HeadTraining


class FederationConfig(HeadTraining, TwinSettings, StrategySettings):
    """Rounds, local training, the strategy and how missing clients are handled (``twin``: a
    FedDTW forecaster name, ``drop`` = plain FedAvg over present ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(10, ge=1, description="global rounds G")
    seed: int = Field(42, description="seeds the model, the clients' split and every draw")
    test_every_round: bool = Field(
        True, description="report test metrics after every round (costs a pass over the test split)"
    )
    tested_round: Literal["best", "last"] = Field(
        "best", description="whose served models the final test uses: the round with the best global "
        "validation score (MSE; QS for quantile models), or the last round"
    )

    @model_validator(mode="before")
    @classmethod
    def _fedgame_clients(cls, data: object) -> object:
        """Fed-GAME's clients keep private models (section 2.2 (1)) unless told otherwise."""
        if isinstance(data, dict) and data.get("strategy") == "fedgame":
            return {"private_model": True, **data}
        return data

    @model_validator(mode="after")
    def _head_strategy(self) -> "FederationConfig":
        if self.strategy == "fedpod":
            raise ValueError("strategy 'fedpod' personalizes prompts: simulate it with the prompt learners")
        return self
