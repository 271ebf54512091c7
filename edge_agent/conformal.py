"""Split-conformal calibration of quantile intervals (issue 14, item 2): conformalized quantile
regression (CQR; Romano, Patterson and Candès 2019, "Conformalized Quantile Regression", NeurIPS).

On a gateway's own calibration windows (its validation split) the conformity score of a target is
E = max(q_lo - y, y - q_hi) (CQR eq. 6), where q_lo and q_hi are the lowest and highest predicted
quantiles. The offset is Q_{1-alpha}(E) := the ceil((1 - alpha)(n + 1))-th smallest of the n
scores, i.e. the (1 - alpha)(1 + 1/n) empirical quantile (CQR eq. 7), with nominal coverage
1 - alpha = highest level - lowest level (0.8 for 0.1 .. 0.9). The calibrated interval is
[q_lo - offset, q_hi + offset] (CQR eq. 8); a negative offset narrows it. If the calibration
and test windows are exchangeable, it covers a fresh target with probability >= 1 - alpha
(CQR theorem 1).

Offsets are fitted per (horizon step, feature), not pooled: the forecast error grows with the
horizon and the features of a gateway have different units and noise, so one pooled offset
would over-cover near steps and quiet features and under-cover far steps and noisy ones, while
the guarantee holds for each (step, feature) series of n scores on its own. Consecutive windows
overlap, so exchangeability holds only approximately (as for any split-conformal on a series).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

# ceil((1 - alpha)(n + 1)) of a product like 0.8 * 10 that floating point lands just above an
# integer must not take one score more
_ROUNDING = 1e-9


def nominal_coverage(levels: Sequence[float]) -> float:
    """1 - alpha: the share the interval [lowest, highest quantile] should cover."""
    if len(levels) < 2:
        raise ValueError(f"conformal calibration needs at least two quantile levels, got {tuple(levels)}")
    return levels[-1] - levels[0]


def conformity_scores(forecast: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """CQR's score E = max(q_lo - y, y - q_hi) (eq. 6), shape of ``target``: negative inside the
    interval, the distance to the nearer-violated bound outside."""
    return torch.maximum(forecast[..., 0] - target, target - forecast[..., -1])


def fit_offsets(forecast: torch.Tensor, target: torch.Tensor, levels: Sequence[float]) -> torch.Tensor:
    """Offsets (H, F) from calibration forecasts (N, H, F, Q) and targets (N, H, F): per step and
    feature, the ceil((1 - alpha)(N + 1))-th smallest of the N scores (CQR eq. 7)."""
    if forecast.shape[:-1] != target.shape or forecast.dim() != 4:
        raise ValueError(f"fit_offsets wants forecasts (N, H, F, Q) and targets (N, H, F), "
                         f"got {tuple(forecast.shape)} and {tuple(target.shape)}")
    n = target.shape[0]
    rank = math.ceil(nominal_coverage(levels) * (n + 1) - _ROUNDING)
    if rank > n:
        raise ValueError(f"{n} calibration windows are too few for coverage {nominal_coverage(levels):.3g}: "
                         f"the offset would be the {rank}-th smallest score (infinite)")
    scores = conformity_scores(forecast, target)
    return scores.kthvalue(rank, dim=0).values


def apply_offsets(forecast: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Calibrated forecasts (..., H, F, Q): the lowest quantile moved down and the highest up by the
    offset (CQR eq. 8), inner levels unchanged. To stay non-crossing under a negative offset, each
    outer quantile is clamped at its inner neighbour (the median when the levels are 0.1, 0.5, 0.9)."""
    if forecast.shape[-1] < 3:
        raise ValueError("apply_offsets needs an inner quantile (the median) to clamp the outer ones at")
    lower = torch.minimum(forecast[..., 0] - offsets, forecast[..., 1])
    upper = torch.maximum(forecast[..., -1] + offsets, forecast[..., -2])
    return torch.cat([lower.unsqueeze(-1), forecast[..., 1:-1], upper.unsqueeze(-1)], dim=-1)
