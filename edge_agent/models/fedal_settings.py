"""FeDaL's device-side settings, apart from the learner so that ``agent.toml`` and
``coordinator.toml`` (pretrain mode's ``fedal_client``) can name them without importing learners."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.coreset import CoresetSettings
from edge_agent.models.dbe import DBESettings


class FedalClientSettings(BaseModel):
    """The client half of FeDaL; ``dbe``/``coreset`` set to None give the plain baselines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    patch: int = Field(3, ge=1, description="steps per patch of the masked input")
    mask_rate: float = Field(0.75, gt=0.0, lt=1.0, description="share of masked patches (paper: 75%)")
    dbe: DBESettings | None = Field(DBESettings(), description="Domain Bias Elimination (None: off)")
    coreset: CoresetSettings | None = Field(CoresetSettings(), description="core-set upload (None: none)")
    prox_mu: float = Field(0.0, ge=0.0, description="FedProx proximal weight (the FedProx baseline)")
