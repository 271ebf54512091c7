"""Quantile levels of a forecast: their check and where the median sits. Torch-free, so that
configs (``edge_agent.models.config``) validate them before torch is imported."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator


def median_index(levels: Sequence[float]) -> int:
    """Where level 0.5 sits: its quantile is the point forecast (MSE/MAE are of the median)."""
    return list(levels).index(0.5)


def check_quantiles(levels: tuple[float, ...]) -> tuple[float, ...]:
    """Quantile levels must be strictly increasing inside (0, 1) and include 0.5: the median is the
    point forecast wherever one is expected (MSE/MAE, serving), so it is predicted, not interpolated."""
    if any(not 0.0 < q < 1.0 for q in levels):
        raise ValueError(f"every level must lie strictly between 0 and 1, got {levels}")
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise ValueError(f"levels must be strictly increasing, got {levels}")
    if 0.5 not in levels:
        raise ValueError(f"levels must include 0.5 (the median is the point forecast), got {levels}")
    return levels


QuantileLevels = Annotated[tuple[float, ...], AfterValidator(check_quantiles)]
"""A config field of quantile levels, checked by ``check_quantiles`` (head and prompt mode alike)."""
