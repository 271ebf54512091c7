"""A compact iTransformer (Liu et al. 2024): every aligned channel is one token."""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.models.backbones.base import Backbone, BackboneSizes


class ITransformer(Backbone):
    """Embeds each channel's length-L series, runs a Transformer encoder across channels.

    Output (B, D, d_qap): the head maps the token width D to the horizon, which is the
    iTransformer projector made personal.
    """

    def __init__(self, cfg: BackboneSizes):
        super().__init__()
        width = cfg.size("hidden", 512)
        self.embed = nn.Sequential(nn.Linear(cfg.lookback, width), nn.Dropout(cfg.dropout))
        layer = nn.TransformerEncoderLayer(
            width,
            cfg.size("heads", 8),
            cfg.size("d_ff", 2048),
            cfg.dropout,
            activation="gelu",
            batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(
            layer, cfg.size("layers", 2), norm=nn.LayerNorm(width), enable_nested_tensor=False
        )
        self.out_shape = (width, cfg.d_qap)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        tokens = self.encoder(self.embed(z.transpose(1, 2)))
        return tokens.transpose(1, 2)
