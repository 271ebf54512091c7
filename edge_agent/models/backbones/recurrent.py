"""LSTM and GRU backbones over the aligned sequence."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.backbones.base import Backbone, BackboneSizes


class _Recurrent(Backbone):
    """A stacked recurrent network returning every step's hidden state (B, L, hidden)."""

    cell: type[nn.LSTM] | type[nn.GRU]

    def __init__(self, cfg: BackboneSizes):
        super().__init__()
        hidden, layers = cfg.size("hidden", 128), cfg.size("layers", 2)
        self.rnn = self.cell(
            cfg.d_qap, hidden, layers, batch_first=True, dropout=cfg.dropout if layers > 1 else 0.0
        )
        self.out_shape = (cfg.lookback, hidden)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.rnn(z)[0]


class LSTM(_Recurrent):
    """Long short-term memory backbone."""

    cell = nn.LSTM


class GRU(_Recurrent):
    """Gated recurrent unit backbone."""

    cell = nn.GRU
