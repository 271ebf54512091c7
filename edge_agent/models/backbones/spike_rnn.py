"""SpikeRNN (SeqSNN): conv spike encoder, then a stack of Linear + LIF layers over T steps."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.backbones.base import BackboneSizes
from edge_agent.models.backbones.spiking import ConvSpikeEncoder, SpikingBackbone, SpikingLinear


class SpikeRNN(SpikingBackbone):
    """Encoder spikes -> Linear(d, D)+LIF -> ``layers`` x (Linear(D, D)+LIF); mean rate over T.

    Every layer is a plain Linear + LIF stack, which is what Lava netx and NIR can express.
    """

    def __init__(self, cfg: BackboneSizes):
        super().__init__()
        hidden = cfg.size("hidden", 64)
        self.encoder = ConvSpikeEncoder(cfg.steps)
        self.stack = nn.Sequential(
            SpikingLinear(cfg.d_qap, hidden),
            *(SpikingLinear(hidden, hidden) for _ in range(cfg.size("layers", 2))),
        )
        self.out_shape = (cfg.lookback, hidden)

    def spike_steps(self, spikes: torch.Tensor) -> torch.Tensor:
        return self.stack(spikes)
