"""FeDaL's Domain Bias Elimination on the client (FeDaL, Method, Key Design 1): a module that sits
between the foundation model's encoder and its reconstruction layer and leaves both unchanged.

The hidden sequence of a masked input is decomposed into trend (moving average over positions,
kernel tau) and seasonal (the rest); their means over the mini-batch, scaled per channel by the
learnable gamma_t and gamma_s, form the client's bias b = Mean(h_t) * gamma_t + Mean(h_s) *
gamma_s, a (positions, channels) tensor, so b_t can absorb the client's low-frequency drift and
b_s its periodic shape. The bias is re-injected before reconstruction, pulled toward the fleet's
reference b^g by lambda ||b - b^g||^2, and smoothed over mini-batches by an exponential moving
average. With the dataset's own shift carried by b, the backbone is pushed to learn what
transfers between clients.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from edge_agent.models.fedal_settings import DBESettings


def decompose(hidden: torch.Tensor, kernel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(trend, seasonal) of a (B, L, D) hidden sequence: trend is the centred moving average over
    positions with the ends repeated (as DLinear's series decomposition), seasonal the rest."""
    pad = kernel // 2
    padded = torch.cat([hidden[:, :1].expand(-1, pad, -1), hidden, hidden[:, -1:].expand(-1, pad, -1)], dim=1)
    trend = F.avg_pool1d(padded.transpose(1, 2), kernel, stride=1).transpose(1, 2)
    return trend, hidden - trend


class DomainBiasElimination(nn.Module):
    """The client's bias from a mini-batch's hidden sequence; ``running`` is its EMA."""

    def __init__(self, window: int, d_model: int, settings: DBESettings):
        super().__init__()
        self.settings = settings
        self.gamma_trend = nn.Parameter(torch.ones(d_model))
        self.gamma_seasonal = nn.Parameter(torch.ones(d_model))
        self.register_buffer("running", torch.zeros(window, d_model))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def batch_bias(self, hidden: torch.Tensor) -> torch.Tensor:
        """b of one mini-batch, (L, D), differentiable in gamma and in the hidden sequence."""
        trend, seasonal = decompose(hidden, self.settings.kernel)
        return trend.mean(0) * self.gamma_trend + seasonal.mean(0) * self.gamma_seasonal

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """The bias to re-inject for ``hidden``: while training, the EMA including this batch
        (which also becomes the new running bias); in eval mode the running bias."""
        length = hidden.shape[1]
        if not self.training:
            return self.running[:length]
        current = self.batch_bias(hidden)
        if int(self.batches) > 0:
            current = self.settings.momentum * self.running[:length] + (1 - self.settings.momentum) * current
        with torch.no_grad():
            self.running[:length] = current.detach()
            self.batches += 1
        return current

    def regularization(self, bias: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """lambda * mean((b - b^g)^2) toward the fleet's reference."""
        return self.settings.weight * (bias - reference[: bias.shape[0]]).pow(2).mean()
