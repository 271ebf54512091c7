"""Quantile forecast metrics of Fed-GAME (section 3, Table 1): pinball loss, QS, ICP and MIL.

The text of the paper we have names the three criteria and their directions ("ICP should approach
0.8, while QS and MIL should be minimized", section 3) but its Table 1 formulas did not survive
extraction; the definitions below are the standard ones of quantile regression it cites ([20]):

- pinball loss of level tau: rho_tau(u) = max(tau * u, (tau - 1) * u) with u = y - q_tau;
- QS: the pinball loss averaged over every predicted element and every level;
- ICP: the share of targets inside [q_lowest, q_highest] (bounds included); with the levels
  0.1 and 0.9 its nominal value is 0.8, the target the paper gives;
- MIL: the mean of q_highest - q_lowest.

Quantile forecasts carry the levels on their last axis: (..., Q) against targets (...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _levels_like(levels: Sequence[float], forecast: torch.Tensor) -> torch.Tensor:
    if forecast.shape[-1] != len(levels):
        raise ValueError(f"forecast has {forecast.shape[-1]} quantiles on its last axis, levels name {len(levels)}")
    return torch.as_tensor(levels, dtype=forecast.dtype, device=forecast.device)


def pinball_terms(forecast: torch.Tensor, target: torch.Tensor, levels: Sequence[float]) -> torch.Tensor:
    """Elementwise pinball loss rho_tau(y - q_tau), shape (..., Q): sums of it stream over batches."""
    error = target.unsqueeze(-1) - forecast
    tau = _levels_like(levels, forecast)
    return torch.maximum(tau * error, (tau - 1) * error)


def pinball_loss(forecast: torch.Tensor, target: torch.Tensor, levels: Sequence[float]) -> torch.Tensor:
    """The training loss of quantile mode: the mean pinball loss over elements and levels (= QS)."""
    return pinball_terms(forecast, target, levels).mean()


def quantile_score(forecast: torch.Tensor, target: torch.Tensor, levels: Sequence[float]) -> float:
    """QS (Fed-GAME Table 1): mean pinball loss over every element and level; lower is better."""
    return pinball_loss(forecast, target, levels).item()


def covered(forecast: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1.0 where the target lies in [lowest, highest] quantile (bounds included), else 0.0."""
    return ((forecast[..., 0] <= target) & (target <= forecast[..., -1])).to(forecast.dtype)


def widths(forecast: torch.Tensor) -> torch.Tensor:
    """Interval length highest - lowest quantile per element."""
    return forecast[..., -1] - forecast[..., 0]


def interval_coverage(forecast: torch.Tensor, target: torch.Tensor) -> float:
    """ICP (Fed-GAME Table 1): share of targets inside the outermost quantiles' interval; it should
    approach the nominal coverage highest - lowest level (0.8 for 0.1 .. 0.9, section 3)."""
    return covered(forecast, target).mean().item()


def mean_interval_length(forecast: torch.Tensor) -> float:
    """MIL (Fed-GAME Table 1): mean width of the outermost quantiles' interval; lower is better."""
    return widths(forecast).mean().item()
