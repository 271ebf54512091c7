"""Model zoo: QAP alignment, ANN/SNN backbones and personalized heads. ``ModelConfig`` and the
backbone names import without torch, so configs are checked before it loads; the torch-based
names load on first use (PEP 562)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from edge_agent.models.backbones import BACKBONES
from edge_agent.models.config import ModelConfig

if TYPE_CHECKING:
    from edge_agent.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
    from edge_agent.models.forecaster import SHARED_PREFIX, Forecaster, TensorDict, build_forecaster

TORCH_BASED = {"CheckpointError": "checkpoint", "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
               "SHARED_PREFIX": "forecaster", "Forecaster": "forecaster", "TensorDict": "forecaster",
               "build_forecaster": "forecaster"}
"""Name -> the module of this package that defines it."""


def __getattr__(name: str) -> Any:
    if name not in TORCH_BASED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{TORCH_BASED[name]}"), name)


__all__ = ["BACKBONES", "ModelConfig", *TORCH_BASED]
