"""Personalized forecast heads (FedPer): backbone output back to the client's (H, F_i), or to Q
non-crossing quantiles per horizon step and feature."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge_agent.levels import median_index


class PersonalHead(nn.Module):
    """Factorized linear read-out: ``Linear(A -> H)`` along the backbone's sequence axis, then
    ``Linear(C -> F_i)`` along its channel axis. It never leaves the client (FedPer section 3.3).
    """

    def __init__(self, backbone_shape: tuple[int, int], horizon: int, n_features: int):
        super().__init__()
        length, channels = backbone_shape
        self.time = nn.Linear(length, horizon)
        self.channels = nn.Linear(channels, n_features)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` (B, A, C) -> (B, H, F_i)."""
        return self.channels(self.time(h.transpose(1, 2)).transpose(1, 2))


class QuantileHead(PersonalHead):
    """The same factorized read-out with ``F_i * Q`` output channels, made non-crossing by a
    monotone parameterization anchored at the median: the median is a raw output, each level above
    it adds a softplus of its raw output to the level below, each level below subtracts one from
    the level above. Quantiles are therefore non-decreasing in the level by construction (no
    sorting, so every level keeps its own gradient), and the median is the plain linear read-out.
    """

    def __init__(self, backbone_shape: tuple[int, int], horizon: int, n_features: int, levels: tuple[float, ...]):
        super().__init__(backbone_shape, horizon, n_features * len(levels))
        self.n_levels, self.median = len(levels), median_index(levels)
        self.monotone = MonotoneQuantiles(self.median)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` (B, A, C) -> (B, H, F_i, Q), ordered like the levels."""
        return self.monotone(super().forward(h).unflatten(-1, (-1, self.n_levels)))


class MonotoneQuantiles(nn.Module):
    """``monotone_quantiles`` as a module (no parameters), so operation counting sees its work."""

    def __init__(self, median: int):
        super().__init__()
        self.median = median

    def forward(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw outputs (..., Q) -> non-crossing quantiles (..., Q)."""
        return monotone_quantiles(raw, self.median)


def monotone_quantiles(raw: torch.Tensor, median: int) -> torch.Tensor:
    """Raw outputs (..., Q) -> quantiles (..., Q): q_m = raw_m at the median index m,
    q_j = q_{j-1} + softplus(raw_j) above it and q_j = q_{j+1} - softplus(raw_j) below it."""
    gaps = F.softplus(raw)
    centre = raw[..., median : median + 1]
    above = centre + gaps[..., median + 1 :].cumsum(-1)
    below = centre - gaps[..., :median].flip(-1).cumsum(-1).flip(-1)
    return torch.cat([below, centre, above], dim=-1)
