"""Model zoo: QAP alignment, ANN/SNN backbones and personalized heads."""

from edge_agent.models.backbones import BACKBONES, Backbone
from edge_agent.models.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from edge_agent.models.config import ModelConfig
from edge_agent.models.forecaster import SHARED_PREFIX, Forecaster, TensorDict, build_forecaster

__all__ = [
    "BACKBONES",
    "SHARED_PREFIX",
    "Backbone",
    "CheckpointError",
    "Forecaster",
    "ModelConfig",
    "TensorDict",
    "build_forecaster",
    "load_checkpoint",
    "save_checkpoint",
]
