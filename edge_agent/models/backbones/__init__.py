"""Backbone registry: adding a backbone is one module plus one line here."""

from __future__ import annotations

from edge_agent.models.backbones.base import Backbone
from edge_agent.models.backbones.dlinear import DLinear
from edge_agent.models.backbones.itransformer import ITransformer
from edge_agent.models.backbones.recurrent import GRU, LSTM
from edge_agent.models.backbones.spike_rnn import SpikeRNN
from edge_agent.models.backbones.spikformer import ISpikformer, Spikformer

BACKBONES: dict[str, type[Backbone]] = {
    "dlinear": DLinear,
    "itransformer": ITransformer,
    "lstm": LSTM,
    "gru": GRU,
    "spikernn": SpikeRNN,
    "spikformer": Spikformer,
    "ispikformer": ISpikformer,
}

__all__ = ["BACKBONES", "Backbone"]
