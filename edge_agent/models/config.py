"""Model configuration shared by the agent, the coordinator and the benchmarks."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_agent.metrics import median_index
from edge_agent.models.backbones import BACKBONES
from edge_agent.recipe import MODEL as RECIPE
from edge_agent.registry import registered


def check_quantiles(levels: tuple[float, ...]) -> tuple[float, ...]:
    """Quantile levels must be strictly increasing inside (0, 1) and include 0.5: the median is the
    point forecast wherever one is expected (MSE/MAE, serving), so it is predicted, not interpolated."""
    if any(not 0.0 < q < 1.0 for q in levels):
        raise ValueError(f"every level must lie strictly between 0 and 1, got {levels}")
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"levels must be strictly increasing, got {levels}")
    if 0.5 not in levels:
        raise ValueError(f"levels must include 0.5 (the median is the point forecast), got {levels}")
    return levels


QuantileLevels = Annotated[tuple[float, ...], AfterValidator(check_quantiles)]
"""A config field of quantile levels, checked by ``check_quantiles`` (head and prompt mode alike)."""


PAPER: dict[str, object] = {"lookback": 96, "horizon": 48, "d_qap": 128, "qap_heads": 4, "projection": "qap",
                            "head": "personal", "seasonal_base": False, "loss": "mse"}
"""FedQAPer's model (section 3, appendix A.2) where the defaults differ: what the paper benchmarks build."""


class ModelConfig(BaseModel):
    """What to build: backbone, window sizes and the alignment (QAP, a plain projection or none:
    channel-independent).

    The defaults are the product's recipe (``edge_agent.recipe``); the papers' settings are
    ``ModelConfig.paper()``. Backbone sizes left as ``None`` take the
    backbone's paper default (FedQAPer Table 6).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    backbone: str = Field(RECIPE["backbone"], description=f"the shared network: {' | '.join(BACKBONES)}")
    lookback: int = Field(RECIPE["lookback"], ge=2, description="input window length L (a week of hourly steps)")
    horizon: int = Field(RECIPE["horizon"], ge=1, description="forecast length H (a day of hourly steps)")
    d_qap: int = Field(RECIPE["d_qap"], ge=1, description="QAP latent width (paper A.2: 128); per feature when channel-independent")
    qap_heads: int = Field(RECIPE["qap_heads"], ge=1, description="QAP attention heads (d_qap divisible by it)")
    qap_queries: int = Field(1, ge=1, description="learnable queries Q (paper: 1)")
    projection: Literal["qap", "linear", "channel"] = Field(
        RECIPE["projection"], description="feature alignment: qap (Query Attention Pooling, FedQAPer 3.2), linear (a per-client "
        "projection) or channel (channel-independent: every feature its own sequence through the shared model)"
    )
    instance_norm: bool = Field(
        True, description="normalize each input window per feature and undo it on the forecast"
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0, description="dropout rate while training: QAP pooling, the "
                           "itransformer backbone, lstm and gru between layers")
    hidden: int | None = Field(None, ge=1, description="backbone width (default: the backbone's paper value)")
    layers: int | None = Field(None, ge=1, description="backbone layers or blocks (default: the backbone's paper "
                               "value; dlinear has none)")
    heads: int | None = Field(None, ge=1, description="attention heads of itransformer, spikformer and ispikformer "
                              "(default: the backbone's paper value)")
    d_ff: int | None = Field(None, ge=1, description="feed-forward width in itransformer, spikformer and ispikformer "
                             "blocks (default: the backbone's paper value)")
    steps: int = Field(4, ge=1, description="SNN time steps T")
    moving_avg: int = Field(25, ge=1, description="DLinear decomposition kernel")
    head: Literal["personal", "shared"] = Field(
        RECIPE["head"], description="the forecast head stays on the gateway (FedPer) or is aggregated too (channel "
        "projection only: its shape does not depend on the gateway's features)"
    )
    seasonal_base: bool = Field(
        RECIPE["seasonal_base"], description="forecast a correction to a learned average of the lookback's last seasons, starting "
        "at the seasonal window average (edge_agent.models.seasonal)"
    )
    season: int = Field(RECIPE["season"], ge=1, description="steps per season for seasonal_base (24: a day of hourly data)")
    loss: Literal["mse", "mae"] = Field(
        RECIPE["loss"], description="point forecasts trained for the mean (mse) or the median (mae, what MASE rewards)"
    )
    quantiles: QuantileLevels | None = Field(
        None, description="quantile levels of the personal head (e.g. 0.1, 0.5, 0.9); None = point forecasts"
    )

    @classmethod
    def paper(cls, **overrides: object) -> ModelConfig:
        """FedQAPer's model (``PAPER``) with ``overrides``."""
        return cls(**{**PAPER, **overrides})

    @field_validator("backbone")
    @classmethod
    def _known_backbone(cls, name: str) -> str:
        return registered(name, BACKBONES, "backbone")

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        if self.head == "shared" and self.projection != "channel":
            raise ValueError(f"head = 'shared' needs projection = 'channel' (a {self.projection} head is shaped by "
                             "each gateway's feature count)")
        if self.seasonal_base and self.lookback < self.season:
            raise ValueError(f"seasonal_base needs lookback >= season ({self.season} steps), got {self.lookback}")
        if self.d_qap % self.qap_heads:
            raise ValueError(f"d_qap ({self.d_qap}) must be divisible by qap_heads ({self.qap_heads})")
        return self

    @property
    def median_index(self) -> int:
        """Position of level 0.5 in ``quantiles``: the point forecast of a quantile model."""
        return median_index(self.quantiles) if self.quantiles else 0

    def size(self, name: str, default: int) -> int:
        """A backbone size from the config, or the backbone's own default."""
        value = getattr(self, name)
        return default if value is None else value

