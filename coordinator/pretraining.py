"""Pretrain mode in the coordinator service: which strategies fit the fleet's device side, FeDaL's
server taking its model from the fleet's ``foundation_model``, and the pretrained model written
as a foundation checkpoint (``<state_dir>/foundation.safetensors``) after every round. The checks
are torch-free (``coordinator.config`` runs them); writing loads the model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from coordinator.strategy_settings import GBESettings, StrategySettings
from edge_agent.config import FleetModel
from edge_agent.models.foundation_config import FoundationConfig

if TYPE_CHECKING:
    from edge_agent.tensors import TensorDict

FOUNDATION_FILE = "foundation.safetensors"


def with_fleet_foundation(data: object) -> object:
    """A raw ``coordinator.toml`` with ``fedal.model`` taken from ``foundation_model`` where a
    pretrain fleet runs FeDaL and leaves it out, so the model's sizes are given once."""
    if not isinstance(data, dict) or data.get("mode") != "pretrain" or data.get("strategy") != "fedal":
        return data
    fedal = data.get("fedal", {})
    if isinstance(fedal, GBESettings):
        fedal = fedal.model_dump(exclude_unset=True)
    if "model" in fedal or "foundation_model" not in data:
        return data
    return {**data, "fedal": {**fedal, "model": data["foundation_model"]}}


def check_pretraining(fleet: FleetModel, cfg: StrategySettings) -> None:
    """FeDaL tunes on core-sets, which only pretrain mode's FeDaL devices upload, on the fleet's
    own model with the devices' masks; no other strategy may receive core-sets (it would average
    them into the model)."""
    device = fleet.fedal_client
    coresets = fleet.mode == "pretrain" and device is not None and device.coreset is not None
    if cfg.strategy != "fedal":
        if coresets:
            raise ValueError(f"fedal_client: its devices upload core-sets, which only strategy 'fedal' uses, "
                             f"not {cfg.strategy!r}")
        return
    if not coresets:
        raise ValueError("strategy 'fedal' tunes on the devices' core-sets: it needs mode = 'pretrain' with "
                         "[fedal_client] (core-sets on)")
    if cfg.fedal.model != fleet.foundation_model:
        raise ValueError("fedal.model differs from foundation_model: the server would tune another model than "
                         "the devices train (leave fedal.model out: it is taken from foundation_model)")
    for name in ("patch", "mask_rate"):
        server, devices = getattr(cfg.fedal, name), getattr(device, name)
        if server != devices:
            raise ValueError(f"fedal.{name} = {server} differs from fedal_client.{name} = {devices}: the server "
                             "tunes on the core-sets with the devices' masks")


def write_foundation(state: TensorDict, cfg: FoundationConfig, folder: Path) -> tuple[Path, str]:
    """``state`` as a foundation checkpoint at ``folder / FOUNDATION_FILE`` (written atomically,
    so a crash leaves the previous round's); returns the path and its content hash."""
    from edge_agent.models.foundation import FoundationModel, save_foundation

    model = FoundationModel(cfg)
    model.load_state_dict(state)
    path = Path(folder) / FOUNDATION_FILE
    return path, save_foundation(model, path)
