"""The median of several forecasters: the robust forecast combination a gateway may serve.

Averaging forecasts beats choosing one of them more often than not (the forecast combination
puzzle; Bates & Granger 1969, the M4 competition's leaders), and the median is the operator that
one wild member cannot drag away (Kourentzes, Barrow & Crone 2014, "Neural network ensemble
operators for time series forecasting"). A gateway combines its learned models with its anchors
(``edge_agent.selection``); where every anchor needs only the lookback window (``LookbackAnchor``)
the combination is one module with a forecaster's interface and exports to ONNX like any model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Combination(nn.Module):
    """(x (B, L, F), marks) -> (B, H, F): one point forecast made of its members' point forecasts
    by :meth:`combine` over the stacked (M, B, H, F); a quantile model is no member (it has its own
    median)."""

    levels = None
    operator = "combination"

    def __init__(self, members: Sequence[nn.Module]):
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"a {self.operator} needs at least two forecasters, got {len(members)}")
        if any(getattr(member, "levels", None) for member in members):
            raise ValueError(f"the {self.operator} combines point forecasters; a quantile model has its own median")
        self.members = nn.ModuleList(members)

    def forward(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        return self.combine(torch.stack([member(x, marks) for member in self.members]))

    def combine(self, stacked: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class MedianForecaster(Combination):
    """The element-wise median of the members (with an even count the mean of the two middle
    ones, as numpy's median). Sorting is one ONNX TopK, so the exported graph computes exactly this."""

    operator = "median"

    def combine(self, stacked: torch.Tensor) -> torch.Tensor:
        return median_forecast(stacked)


class MeanForecaster(Combination):
    """The mean of the members, what a gateway serves with ``combine`` > 1 (``edge_agent.choice``);
    exports to ONNX as one graph."""

    operator = "mean"

    def combine(self, stacked: torch.Tensor) -> torch.Tensor:
        return stacked.mean(dim=0)


def median_forecast(stacked: torch.Tensor) -> torch.Tensor:
    """The median over the first axis of stacked forecasts (M, ...), the mean of the two middle
    ones for an even M (torch.median would take the lower one)."""
    ordered, count = stacked.sort(dim=0).values, stacked.shape[0]
    return (ordered[(count - 1) // 2] + ordered[count // 2]) / 2
