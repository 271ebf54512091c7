"""Spikformer and the inverted iSpikformer (SeqSNN) with spiking self-attention."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.backbones.base import Backbone
from edge_agent.models.backbones.spiking import (
    ConvSpikeEncoder,
    SpikingBlock,
    SpikingLinear,
    init_transformer_weights,
)
from edge_agent.models.config import ModelConfig


class Spikformer(Backbone):
    """Tokens are time steps: encoder spikes -> Linear(d, D)+LIF -> spiking blocks; mean over T."""

    kind = "snn"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.size("hidden", 64)
        self.encoder = ConvSpikeEncoder(cfg.steps)
        self.embed = SpikingLinear(cfg.d_qap, hidden)
        self.blocks = nn.Sequential(
            *(
                SpikingBlock(hidden, cfg.size("d_ff", 256), cfg.size("heads", 8))
                for _ in range(cfg.size("layers", 2))
            )
        )
        init_transformer_weights(self)
        self.out_shape = (cfg.lookback, hidden)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(self.encoder(z))).mean(0)


class ISpikformer(Backbone):
    """Tokens are aligned channels: each channel's spike train over L is embedded to D.

    Output (B, D, d_qap) after the mean over T (the head's "mean pooling", FedQAPer 4.2).
    """

    kind = "snn"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hidden = cfg.size("hidden", 128)
        self.encoder = ConvSpikeEncoder(cfg.steps)
        self.embed = SpikingLinear(cfg.lookback, hidden)
        self.blocks = nn.Sequential(
            *(
                SpikingBlock(hidden, cfg.size("d_ff", 512), cfg.size("heads", 8))
                for _ in range(cfg.size("layers", 2))
            )
        )
        init_transformer_weights(self)
        self.out_shape = (hidden, cfg.d_qap)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(self.encoder(z).transpose(-2, -1))
        return self.blocks(tokens).mean(0).transpose(1, 2)
