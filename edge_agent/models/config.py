"""Model configuration shared by the agent, the coordinator and the benchmarks."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.models.backbones import BACKBONES
from edge_agent.registry import registered


class ModelConfig(BaseModel):
    """What to build: backbone, window sizes and the alignment (QAP or a plain projection).

    Backbone sizes left as ``None`` take the backbone's paper default (FedQAPer Table 6).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backbone: str = "dlinear"
    lookback: int = Field(96, ge=2, description="input window length L")
    horizon: int = Field(48, ge=1, description="forecast length H")
    d_qap: int = Field(128, ge=4, description="QAP latent width (paper A.2: 128)")
    qap_heads: int = Field(4, ge=1)
    qap_queries: int = Field(1, ge=1, description="learnable queries Q (paper: 1)")
    projection: Literal["qap", "linear"] = "qap"
    instance_norm: bool = Field(
        True, description="normalize each input window per feature and undo it on the forecast"
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    hidden: int | None = Field(None, ge=1)
    layers: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    d_ff: int | None = Field(None, ge=1)
    steps: int = Field(4, ge=1, description="SNN time steps T")
    moving_avg: int = Field(25, ge=1, description="DLinear decomposition kernel")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        registered(self.backbone, BACKBONES, "backbone")
        if self.d_qap % self.qap_heads:
            raise ValueError(f"d_qap ({self.d_qap}) must be divisible by qap_heads ({self.qap_heads})")
        return self

    def size(self, name: str, default: int) -> int:
        """A backbone size from the config, or the backbone's own default."""
        value = getattr(self, name)
        return default if value is None else value
