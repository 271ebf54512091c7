"""Personalized forecast head (FedPer): backbone output back to the client's (H, F_i)."""

from __future__ import annotations

import torch
from torch import nn


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
