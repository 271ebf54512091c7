"""The foundation model's sizes and variables (``foundation_model`` of agent.toml and
coordinator.toml): torch-free, so that configs are checked before the model (``edge_agent.models.foundation``) loads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.data.variables import WEATHER_VARIABLES


class FoundationConfig(BaseModel):
    """Sizes default to what pretrains in minutes on a 2-core CPU; ``paper()`` gives Table 9's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    variables: tuple[str, ...] = Field(WEATHER_VARIABLES, description="canonical variables the model reads, in "
                                       "order: every data column must be one; one a gateway lacks is zero and left "
                                       "out of the loss")
    window: int = Field(24, ge=2, description="positions the model sees: past + forecast horizon (12 h + 12 h)")
    d_model: int = Field(64, ge=4, description="width of the Transformer's hidden states")
    heads: int = Field(4, ge=1, description="attention heads per layer (must divide d_model)")
    layers: int = Field(2, ge=1, description="Transformer encoder layers")
    d_ff: int = Field(128, ge=1, description="width of each layer's feed-forward network")
    dropout: float = Field(0.3, ge=0.0, lt=1.0, description="dropout rate of the encoder layers while pretraining "
                           "(a frozen model in prompt mode uses none)")
    mask_rate: float = Field(0.15, gt=0.0, lt=1.0, description="share of masked positions r")
    mean_masked: float = Field(3.0, ge=1.0, description="mean masked segment length l_m")

    @classmethod
    def paper(cls, **overrides: object) -> "FoundationConfig":
        return cls(**{"d_model": 256, "heads": 8, "layers": 4, "d_ff": 256, **overrides})
