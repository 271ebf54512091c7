"""``edgefl pretrain``'s settings (rounds, local training, participation, FeDaL's sides): torch-free,
so that the command checks its options before the pretraining (``coordinator.simulation.pretrain``) loads."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from coordinator.strategy_settings import GBESettings
from edge_agent.models.fedal_settings import FedalClientSettings
from edge_agent.training_settings import LocalTraining


class PretrainConfig(LocalTraining):
    """Rounds, local training and participation (paper: 20 rounds x 20 local epochs, C = 0.5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(5, ge=1, description="federated rounds (paper: 20)")
    participation: float = Field(0.5, gt=0.0, le=1.0, description="share C of devices per round")
    batch_size: int = Field(64, ge=1)
    stride: int = Field(3, ge=1, description="step between training windows")
    seed: int = Field(42, description="seed of the model's initialization, the devices drawn and the batches")
    strategy: Literal["fedavg", "fedal"] = Field("fedavg", description="fedavg: FedPoD's masked pretraining (appendix "
                                                 "B.1); fedal: FeDaL's bias elimination, core-sets and server correction")
    client: FedalClientSettings | None = Field(None, description="FeDaL's device side (None: FedPoD's plain "
                                               "masked reconstruction, or FeDaL's defaults under fedal)")
    server: GBESettings = Field(GBESettings(), description="fedal: the server side (its model is the one pretrained)")

    @property
    def device_side(self) -> FedalClientSettings | None:
        """FeDaL's device settings in use: ``client``, FeDaL's defaults under fedal, else none."""
        return FedalClientSettings() if self.client is None and self.strategy == "fedal" else self.client
