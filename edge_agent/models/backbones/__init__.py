"""Backbone registry: adding a backbone is one module plus one line here. The names are known
without torch (configs check them); a class is imported when first looked up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_agent.registry import LazyRegistry

if TYPE_CHECKING:
    from edge_agent.models.backbones.base import Backbone

BACKBONES: LazyRegistry[type[Backbone]] = LazyRegistry(__name__, {
    "dlinear": "dlinear:DLinear",
    "itransformer": "itransformer:ITransformer",
    "lstm": "recurrent:LSTM",
    "gru": "recurrent:GRU",
    "spikernn": "spike_rnn:SpikeRNN",
    "spikformer": "spikformer:Spikformer",
    "ispikformer": "spikformer:ISpikformer",
})

__all__ = ["BACKBONES"]
