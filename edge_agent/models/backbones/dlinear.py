"""DLinear (Zeng et al. 2022): moving-average decomposition + two linear maps over time."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge_agent.models.backbones.base import Backbone, BackboneSizes


class DLinear(Backbone):
    """Shared (``individual=False``) seasonal and trend maps L -> H over every aligned channel."""

    def __init__(self, cfg: BackboneSizes):
        super().__init__()
        self.kernel = cfg.moving_avg
        self.seasonal = nn.Linear(cfg.lookback, cfg.horizon)
        self.trend = nn.Linear(cfg.lookback, cfg.horizon)
        for layer in (self.seasonal, self.trend):
            nn.init.constant_(layer.weight, 1.0 / cfg.lookback)
        self.out_shape = (cfg.horizon, cfg.d_qap)

    def moving_average(self, x: torch.Tensor) -> torch.Tensor:
        """Trend of (B, C, L) by an edge-replicated moving average that keeps the length, as differences
        of a running sum (one pass whatever the kernel; pooling costs a pass per kernel step)."""
        left = (self.kernel - 1) // 2
        padded = F.pad(x, (left, self.kernel - 1 - left), mode="replicate")
        sums = F.pad(padded.cumsum(-1), (1, 0))
        return (sums[..., self.kernel:] - sums[..., : -self.kernel]) / self.kernel

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        series = z.transpose(1, 2)
        trend = self.moving_average(series)
        out = self.seasonal(series - trend) + self.trend(trend)
        return out.transpose(1, 2)
