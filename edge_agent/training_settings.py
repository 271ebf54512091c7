"""How a client trains each round (``[training]`` of agent.toml, and the simulations' settings).
Torch-free, so that configs are checked before the training loop (``edge_agent.train``) loads."""

from __future__ import annotations

import copy
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from edge_agent.anchors import ANCHORS
from edge_agent.registry import registered


class LocalTraining(BaseModel):
    """How a client trains each round: epochs E, batch size and learning rate (FedQAPer A.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    local_epochs: int = Field(1, ge=1, description="local epochs E per round")
    batch_size: int = Field(128, ge=1, description="training windows per optimizer step")
    lr: float = Field(1e-3, gt=0, description="learning rate of the local optimizer (Adam)")


class HeadTraining(LocalTraining):
    """Head mode's local training and the remedies for FedAvg's averaging penalty (installing an
    averaged shared part under a personal part trained against another one):

    - ``personal_epochs``: first fit the personal part alone to the received shared part (FedRep,
      Collins et al. 2021, section 3; the local adaptation step of personalized FL);
    - ``alternate``: then train the shared part with the personal part frozen (FedRep's body
      update) instead of both together (FedPer);
    - ``prox_mu``: FedProx's proximal term mu/2 ||theta_s - theta_global||^2 (Li et al. 2020, eq. 2).

    ``keep_local`` makes joining never worse than staying alone: the gateway also trains its own
    local-only model (one epoch per round, nothing sent) and serves whichever validates better;
    ``anchors`` adds the simple forecasts it can make alone to that choice, ``median`` their median
    with the models, ``selection_days`` makes it on recent windows and ``combine`` serves the mean
    of that many best instead of the best alone (``edge_agent.selection``).

    ``private_model`` is Fed-GAME's client (``edge_agent.learners.private``): the gateway's model
    persists from round to round and only the proximal term (``prox_mu``) ties it to the
    global state; the strategy's personalized difference moves it by ``personal_step``.
    """

    personal_epochs: int = Field(0, ge=0, description="epochs on the personal part alone before the shared part")
    alternate: bool = Field(False, description="train the shared part with the personal part frozen (FedRep)")
    prox_mu: float = Field(0.0, ge=0.0, description="FedProx proximal weight on the shared part")
    keep_local: bool = Field(False, description="also train a local-only model and serve it where it validates better")
    local_patience: int = Field(3, ge=1, description="early stopping of that local-only model (epochs)")
    private_model: bool = Field(False, description="Fed-GAME client: keep a persistent private model, the global "
                                "state only anchors the proximal term")
    personal_step: float = Field(1.0, gt=0.0, le=1.0, description="Fed-GAME eq. 2: step towards the personalized "
                                 "difference the coordinator sends")
    anchors: tuple[str, ...] = Field((), description="anchors (edge_agent.anchors: seasonal_naive, window_average, "
                                     "ets, ...) the gateway serves wherever one validates better than its models")
    min_steps: int = Field(0, ge=0, description="at least this many optimizer steps per round: a short history "
                           "gets more passes over its few windows (head mode)")
    max_steps: int = Field(0, ge=0, description="at most this many optimizer steps per round and model (0: no bound): "
                           "a long or finely sampled history trains on a random part of its windows each round, so a "
                           "round's cost stays bounded (head mode)")
    median: bool = Field(False, description="also serve the median of the models and the lookback anchors where it "
                         "scores better (edge_agent.models.combination)")
    selection_days: int = Field(0, ge=0, description="choose what to serve on the known "
                                "outcomes, each weighted by its age, halving every this many days (edge_agent.choice; "
                                "0: all alike)")
    combine: int = Field(1, ge=1, le=8, description="serve the mean of the forecasts of this many best-scoring "
                         "candidates (1: the best alone; point forecasts only), of those near the best's score "
                         "(within edge_agent.choice.NEAR_BEST): a mean of near-equal candidates does not lose to each "
                         "in turn as a daily choice among them does")

    def epochs_over(self, size: int, epochs: int | None = None) -> int:
        """The passes one round makes over ``size`` windows: ``epochs`` (default ``local_epochs``),
        or more where those would take fewer than ``min_steps`` steps."""
        per_epoch = max(1, math.ceil(size / self.batch_size))
        return max(self.local_epochs if epochs is None else epochs, math.ceil(self.min_steps / per_epoch))

    @field_validator("anchors")
    @classmethod
    def _known_anchors(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            registered(name, ANCHORS, "anchors")
        if len(set(names)) != len(names):
            raise ValueError(f"anchors: {list(names)} names one twice")
        return names


def with_defaults(base: type[BaseModel], name: str, module: str, doc: str, defaults: dict[str, Any],
                  **fields: Any) -> type[BaseModel]:
    """``base`` as class ``name`` of ``module``, whose fields keep their type, bounds and description but
    start at ``defaults``, plus new ``fields`` (``(type, Field(...))``): a setting declared once,
    its default set where the recipe lives."""
    unknown = set(defaults) - set(base.model_fields)
    if unknown:
        raise ValueError(f"with_defaults: {sorted(unknown)} are not fields of {base.__name__}")
    changed = {}
    for field, value in defaults.items():
        info = copy.deepcopy(base.model_fields[field])
        info.default = value
        changed[field] = (base.model_fields[field].annotation, info)
    return create_model(name, __base__=base, __doc__=doc, __module__=module, **changed, **fields)
