"""Model configuration shared by the agent, the coordinator and the benchmarks."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_agent.levels import QuantileLevels, median_index
from edge_agent.models.backbones import BACKBONES
from edge_agent.recipe import MODEL as RECIPE
from edge_agent.recipe import SPANS
from edge_agent.registry import registered
from edge_agent.times import duration_text, interval_text, parse_duration

DAY_NS = 86_400 * 10**9


def steps_of(span: str, interval: str) -> int:
    """``span`` (a duration such as '7d') in steps of ``interval`` ('1h': 168); ValueError where
    the span is not a whole number of steps."""
    steps, rest = divmod(parse_duration(span), parse_duration(interval))
    if rest:
        raise ValueError(f"{span} is not a whole number of {interval} steps")
    return steps


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
    interval: str = Field(RECIPE["interval"], description="the data's sampling interval ('10min', '30min', '1h', '1d'): "
                          "lookback, horizon and season left unset are a week, a day and a day of it; every gateway "
                          "of a fleet and its coordinator use one")
    lookback: int = Field(steps_of(SPANS["lookback"], RECIPE["interval"]), ge=2,
                          description="input window length L in steps (default: a week of the interval)")
    horizon: int = Field(steps_of(SPANS["horizon"], RECIPE["interval"]), ge=1,
                         description="forecast length H in steps (default: a day of the interval)")
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
    season: int = Field(steps_of(SPANS["season"], RECIPE["interval"]), ge=1,
                        description="steps per season for seasonal_base (default: a day of the interval)")
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

    @model_validator(mode="before")
    @classmethod
    def _spans_in_steps(cls, data: object) -> object:
        """Lookback, horizon and season left unset: the recipe's spans (``SPANS``) in steps of ``interval``."""
        if not isinstance(data, dict) or "interval" not in data:
            return data
        interval = data["interval"]
        try:
            parse_duration(interval)
        except (TypeError, ValueError) as err:
            raise ValueError(f"interval: {err}") from None
        return {**{name: steps_of(span, interval) for name, span in SPANS.items() if name not in data
                   and parse_duration(span) % parse_duration(interval) == 0}, **data}

    def at_interval(self, interval: str, keep: Collection[str] = ()) -> ModelConfig:
        """This config for data sampled every ``interval``: lookback, horizon and season that were
        not set, or are not named in ``keep``, become the recipe's spans in steps of it."""
        fields = {name: getattr(self, name) for name in self.model_fields_set if name not in SPANS or name in keep}
        return ModelConfig(**{**fields, "interval": interval})

    @property
    def interval_ns(self) -> int:
        """The sampling interval in nanoseconds."""
        return parse_duration(self.interval)

    def step_notes(self) -> list[str]:
        """Where the steps set do not fit the interval: a season that is not a day or a week of it,
        a horizon or lookback shorter than a day, one line each naming the setting to change."""
        day = DAY_NS // self.interval_ns if DAY_NS % self.interval_ns == 0 else None
        notes = []
        if self.seasonal_base and day and self.season not in (day, 7 * day):
            notes.append(f"season = {self.season} steps is {duration_text(self.season * self.interval_ns)} at a "
                         f"{interval_text(self.interval_ns)} interval, not a day ({day} steps) or a week: "
                         f"set [model] season (--season) or leave it unset")
        return notes

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

