"""Spikformer and the inverted iSpikformer (SeqSNN) with spiking self-attention."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from edge_agent.models.backbones.base import BackboneSizes
from edge_agent.models.backbones.spiking import (
    ConvSpikeEncoder,
    SpikingBackbone,
    SpikingBlock,
    SpikingLinear,
    init_transformer_weights,
)


class _SpikingTransformer(SpikingBackbone):
    """Conv spike encoder, a spiking Linear embedding, then spiking self-attention blocks."""
    default_hidden: ClassVar[int]
    default_d_ff: ClassVar[int]

    def __init__(self, cfg: BackboneSizes, embed_from: int):
        super().__init__()
        self.hidden = cfg.size("hidden", self.default_hidden)
        self.encoder = ConvSpikeEncoder(cfg.steps)
        self.embed = SpikingLinear(embed_from, self.hidden)
        self.blocks = nn.Sequential(
            *(
                SpikingBlock(self.hidden, cfg.size("d_ff", self.default_d_ff), cfg.size("heads", 8))
                for _ in range(cfg.size("layers", 2))
            )
        )
        init_transformer_weights(self)


class Spikformer(_SpikingTransformer):
    """Tokens are time steps: encoder spikes -> Linear(d, D)+LIF -> spiking blocks; mean over T."""

    default_hidden, default_d_ff = 64, 256

    def __init__(self, cfg: BackboneSizes):
        super().__init__(cfg, embed_from=cfg.d_qap)
        self.out_shape = (cfg.lookback, self.hidden)

    def spike_steps(self, spikes: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(spikes))


class ISpikformer(_SpikingTransformer):
    """Tokens are aligned channels: each channel's spike train over L is embedded to D.

    Output (B, D, d_qap) after the mean over T (the head's "mean pooling", FedQAPer 4.2).
    """

    default_hidden, default_d_ff = 128, 512

    def __init__(self, cfg: BackboneSizes):
        super().__init__(cfg, embed_from=cfg.lookback)
        self.out_shape = (self.hidden, cfg.d_qap)

    def spike_steps(self, spikes: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.embed(spikes.transpose(-2, -1)))

    def readout(self, rate: torch.Tensor) -> torch.Tensor:
        return rate.transpose(1, 2)
