"""The forecast's starting point: a learned average of the lookback's last seasons.

With ``seasonal_base`` the model forecasts a correction on top of a weighted mean of the same
step in each whole season of its lookback (for hourly data and a week of lookback: the seven
values at the same hour of the last seven days). The weights start equal, so an untrained model
forecasts exactly the seasonal window average anchor (``edge_agent.anchors.WindowAverage``), and
its head starts at zero: training can only move it away from that anchor where the data says so.
With little history this is what keeps a learned model from starting (and staying) worse than
the simple forecast a gateway gets for free; the same idea as learning the residual over a
seasonal baseline (ES-RNN's deseasonalization, Smyl 2020; DLinear's decomposition).
"""

from __future__ import annotations

import torch
from torch import nn

from edge_agent.anchors import lookback_rule


class SeasonalBase(nn.Module):
    """(B, L, F) normalized windows -> (B, H, F): sum over the last ``lookback // season`` seasons
    of weight_k times the value ``k`` seasons before each horizon step's phase."""

    def __init__(self, lookback: int, horizon: int, season: int):
        super().__init__()
        if lookback < season:
            raise ValueError(f"seasonal_base needs a lookback of at least one season ({season} steps), got {lookback}")
        seasons = lookback // season
        self.weights = nn.Parameter(torch.full((seasons,), 1.0 / seasons))
        phase = torch.arange(horizon) % season
        rows = torch.stack([lookback - k * season + phase for k in range(1, seasons + 1)])  # (seasons, H)
        self.register_buffer("rows", rows, persistent=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bkhf,k->bhf", z[:, self.rows], self.weights)


class LookbackAnchor(nn.Module):
    """A seasonal anchor (``edge_agent.anchors.lookback_rule``) as a module with a forecaster's
    interface, (x (B, L, F), marks) -> (B, H, F): what a gateway exports to ONNX to serve it. The
    rules are weighted means of past values with weights summing to one, so they commute with the
    per-feature scaling of the inputs."""

    levels = None

    def __init__(self, name: str, lookback: int, horizon: int, period: int):
        super().__init__()
        rows, weights = lookback_rule(name, lookback, horizon, period)
        self.name = name
        self.register_buffer("rows", torch.as_tensor(rows), persistent=False)
        self.register_buffer("weights", torch.as_tensor(weights, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bkhf,k->bhf", x[:, self.rows], self.weights)
