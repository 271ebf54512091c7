"""FeDaL's device-side settings (pretrain mode's ``fedal_client``: DBE, core-sets), apart from the
learner, ``edge_agent.models.dbe`` and ``edge_agent.coreset``, so that ``agent.toml`` and
``coordinator.toml`` are checked without importing torch."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DBESettings(BaseModel):
    """The summary names lambda and tau without values; these defaults are ours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kernel: int = Field(5, ge=1, description="moving-average kernel tau of the trend (odd)")
    weight: float = Field(0.1, ge=0.0, description="lambda: weight of ||b - b^g||^2 in the client loss")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="EMA momentum of the bias over mini-batches")

    def model_post_init(self, context: object) -> None:
        if self.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd to keep the trend aligned, got {self.kernel}")


class CoresetSettings(BaseModel):
    """Core-set size K, gradient-matching effort and the Fourier-magnitude noise level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    size: int = Field(8, ge=1, le=256, description="K synthetic windows per client and round")
    steps: int = Field(10, ge=0, description="gradient-matching steps per round")
    real_batch: int = Field(32, ge=1, description="real windows per matching step")
    lr: float = Field(0.05, gt=0.0, description="Adam step on the core-set values")
    noise: float = Field(0.5, ge=0.0, description="sigma of the log-normal noise on Fourier magnitudes")


class FedalClientSettings(BaseModel):
    """The client half of FeDaL; ``dbe``/``coreset`` set to None give the plain baselines."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    patch: int = Field(3, ge=1, description="steps per patch of the masked input")
    mask_rate: float = Field(0.75, gt=0.0, lt=1.0, description="share of masked patches (paper: 75%)")
    dbe: DBESettings | None = Field(DBESettings(), description="Domain Bias Elimination (None: off)")
    coreset: CoresetSettings | None = Field(CoresetSettings(), description="core-set upload (None: none)")
    prox_mu: float = Field(0.0, ge=0.0, description="FedProx proximal weight (the FedProx baseline)")
