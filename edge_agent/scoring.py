"""How forecasts are scored so that gateways, methods and history lengths compare: errors on one
reference scale per feature, and MASE, the mean absolute error scaled by the in-sample error of
seasonal naive (Hyndman & Koehler 2006, the M4 and M5 competitions' scaled error).

A model trains on its own normalized scale (a scaler fitted on whatever history its gateway has),
so its raw normalized MSE moves with that history even when the forecasts do not. ``Scale`` turns
a normalized error into (a) an error on the reference scale, the standard deviation of the
reference rows (the whole training split in a benchmark; the gateway's own history in the
product), and (b) MASE units: the absolute error over the mean absolute difference between each
reference value and the value one season earlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def seasonal_naive_mae(values: np.ndarray, period: int) -> np.ndarray:
    """Per column, the mean of |y_t - y_{t-period}| over the pairs where both are present: MASE's
    denominator (its "in-sample seasonal naive error"). NaN for a column without a single pair."""
    data = np.asarray(values, dtype=np.float64)
    if period < 1:
        raise ValueError(f"period must be >= 1, got {period}")
    if len(data) <= period:
        return np.full(data.shape[1], np.nan)
    diffs = np.abs(data[period:] - data[:-period])
    pairs = np.isfinite(diffs).sum(axis=0)
    return np.where(pairs > 0, np.nansum(diffs, axis=0) / np.maximum(pairs, 1), np.nan)


def spread(values: np.ndarray) -> np.ndarray:
    """Per column, the population standard deviation of the present values, 1 where it is (near) zero
    or undefined (a constant column: scores then stay in data units instead of dividing by zero)."""
    data = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        mean, std = np.nanmean(data, axis=0), np.nanstd(data, axis=0)
    tiny = ~np.isfinite(std) | (std <= 1e-7 * np.maximum(1.0, np.abs(np.nan_to_num(mean))))
    return np.where(tiny, 1.0, std)


@dataclass(frozen=True)
class Scale:
    """Per-feature factors (F,) that turn an error on a model's normalized scale into an error on
    the reference scale (``reference``) and into MASE units (``mase``)."""

    reference: torch.Tensor
    mase: torch.Tensor

    @classmethod
    def of(cls, model_std: np.ndarray, reference_rows: np.ndarray, period: int) -> Scale:
        """The scale of a model whose normalized values are data / ``model_std`` (plus an offset),
        scored against ``reference_rows`` (rows x features, data units, NaN where missing) with a
        seasonal period of ``period`` rows. A feature whose seasonal naive error is zero or
        undefined (constant, or shorter than a season) is scaled by its standard deviation instead,
        so its MASE stays finite."""
        std = np.asarray(model_std, dtype=np.float64)
        reference = spread(reference_rows)
        naive = seasonal_naive_mae(reference_rows, period)
        naive = np.where(np.isfinite(naive) & (naive > 1e-7 * reference), naive, reference)
        return cls(torch.as_tensor(std / reference, dtype=torch.float32),
                   torch.as_tensor(std / naive, dtype=torch.float32))

    @classmethod
    def identity(cls, n_features: int) -> Scale:
        """Scores on the model's own normalized scale, MASE unknown (NaN)."""
        return cls(torch.ones(n_features), torch.full((n_features,), float("nan")))


def scaled_errors(error: torch.Tensor, scale: Scale | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized errors (..., F) -> (errors on the reference scale, absolute errors in MASE units)."""
    if scale is None:
        return error, torch.full_like(error, float("nan"))
    return error * scale.reference, error.abs() * scale.mase
