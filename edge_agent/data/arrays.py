"""The numpy half of a client's data: the chronological split, the scaler fitted on the present
training rows, the scaled values, their calendar features, every split's window start rows and the
values in data units the anchors forecast from (``ClientArrays``). ``edge_agent.data.windows``
turns them into tensors (``client_data``). The halves are apart so that a gateway's round can
prepare its data (pandas) and its anchors' forecasts (statsforecast) in one process and train
(torch) in another, neither holding the other's libraries (``edge_agent.round_data``): this
module imports neither torch nor pandas."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.data.errors import DataError
from edge_agent.serving.calendar import calendar_features

if TYPE_CHECKING:
    import pandas as pd
    from torch import Tensor

    from edge_agent.data.table import SeriesTable

Ratios = tuple[float, float, float]
RATIOS: Ratios = (0.8, 0.1, 0.1)
META = "meta"  # the JSON entry of ``ClientArrays.to_npz`` (names, bounds, sizes)


def time_features(index: pd.DatetimeIndex) -> np.ndarray:
    """Cyclic calendar features: sin/cos of the hour of day and of the day of week.

    Positions within the year (Informer's day-of-month/day-of-year ramps) are left out on
    purpose: one year of data holds a single cycle, and a chronological split puts val/test
    outside the training range, where those ramps extrapolate (measured on the weather
    pool, QAP + DLinear: val MSE 0.84 with them, 0.46 without).
    """
    wall = index.tz_localize(None) if index.tz is not None else index  # local wall-clock times, as before
    return calendar_features(wall.as_unit("ns").asi8)


class StandardScaler:
    """Per-column z-scoring fitted on training rows; constant columns keep std 1 so nothing divides by zero."""

    def __init__(self, mean: np.ndarray | None = None, std: np.ndarray | None = None) -> None:
        self.mean = mean
        self.std = std

    def fit(self, values: np.ndarray) -> StandardScaler:
        """Learn each column's mean and population std from `values` (rows x features)."""
        data = np.asarray(values, dtype=np.float64)
        mean, std = data.mean(axis=0), data.std(axis=0)
        std[std <= 1e-7 * np.maximum(1.0, np.abs(mean))] = 1.0
        self.mean, self.std = mean.astype(np.float32), std.astype(np.float32)
        return self

    def transform(self, values: np.ndarray | Tensor) -> np.ndarray | Tensor:
        """Scale to zero mean and unit std (numpy or torch input, same type out)."""
        mean, std = self._stats_like(values)
        return (values - mean) / std

    def inverse_transform(self, values: np.ndarray | Tensor) -> np.ndarray | Tensor:
        """Undo `transform`, e.g. to report forecasts in original units."""
        mean, std = self._stats_like(values)
        return values * std + mean

    def _stats_like(self, values: np.ndarray | Tensor) -> tuple[Any, Any]:
        """Return mean/std as the same array type as `values`, checking the feature count."""
        if self.mean is None or self.std is None:
            raise ValueError("StandardScaler is not fitted")
        if values.shape[-1] != len(self.mean):
            raise ValueError(f"StandardScaler: expected {len(self.mean)} features, got {values.shape[-1]}")
        if not isinstance(values, np.ndarray):
            import torch  # a tensor: torch is loaded already (this module stays torch-free)

            stats = torch.as_tensor(np.stack([self.mean, self.std]), dtype=values.dtype, device=values.device)
            return stats[0], stats[1]
        return self.mean, self.std

    def to_dict(self) -> dict[str, list[float]]:
        """Plain-list form for JSON files."""
        if self.mean is None or self.std is None:
            raise ValueError("StandardScaler is not fitted")
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, Sequence[float]]) -> StandardScaler:
        """Rebuild a scaler saved by `to_dict`, rejecting missing keys, length mismatches and bad stds."""
        try:
            mean = np.asarray(data["mean"], dtype=np.float32)
            std = np.asarray(data["std"], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as err:
            raise DataError(f"scaler: needs numeric lists 'mean' and 'std' ({err!r})") from err
        if mean.ndim != 1 or mean.shape != std.shape:
            shapes = f"{mean.shape}, {std.shape}"
            raise DataError(f"scaler: 'mean' and 'std' must be flat lists of equal length, got {shapes}")
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
            raise DataError("scaler: 'mean' must be finite and 'std' finite and positive")
        return cls(mean, std)


def split_bounds(
    n_rows: int, lookback: int, horizon: int, ratios: Ratios = RATIOS
) -> dict[str, tuple[int, int]]:
    """Row ranges [start, end) of the chronological split; val and test start `lookback` rows early for context."""
    if lookback < 1 or horizon < 1:
        raise ValueError(f"lookback and horizon must be >= 1, got {lookback}, {horizon}")
    _check_ratios(ratios)
    bounds = _bounds(n_rows, lookback, ratios)
    if not _all_windowed(bounds, lookback, horizon):
        needed = min_training_rows(lookback, horizon, ratios)
        raise DataError(f"needs at least {needed} rows for lookback {lookback} + horizon {horizon} (has {n_rows})")
    return bounds


def _check_ratios(ratios: Ratios) -> None:
    """Ratios must be three positive fractions summing to 1."""
    if len(ratios) != 3 or min(ratios) <= 0 or not math.isclose(sum(ratios), 1.0, abs_tol=1e-6):
        raise ValueError(f"ratios must be three positive fractions summing to 1, got {ratios}")


def _bounds(n_rows: int, lookback: int, ratios: Ratios) -> dict[str, tuple[int, int]]:
    """The split without validation: test takes whatever train and val leave."""
    n_train, n_val = int(n_rows * ratios[0]), int(n_rows * ratios[1])
    return {
        "train": (0, n_train),
        "val": (n_train - lookback, n_train + n_val),
        "test": (n_train + n_val - lookback, n_rows),
    }


def _all_windowed(bounds: dict[str, tuple[int, int]], lookback: int, horizon: int) -> bool:
    """True when every split starts inside the series and holds at least one full window."""
    return all(start >= 0 and end - start >= lookback + horizon for start, end in bounds.values())


def min_training_rows(lookback: int, horizon: int, ratios: Ratios = RATIOS) -> int:
    """Smallest N such that every series of N or more rows splits into windowed parts: the least
    history ``prepare_client`` accepts (gaps aside), e.g. before a gateway can train locally."""
    _check_ratios(ratios)
    n = math.ceil(max((lookback + horizon + 1) / ratios[0], (horizon + 1) / ratios[1], horizon / ratios[2] + 1))
    while not _all_windowed(_bounds(n, lookback, ratios), lookback, horizon):
        n += 1
    while n > 1 and _all_windowed(_bounds(n - 1, lookback, ratios), lookback, horizon):
        n -= 1
    return n


def _recent(name: str, train: tuple[int, int], history: int, window: int) -> tuple[int, int]:
    """The last ``history`` rows of the training range, which must hold one full window."""
    if history < window:
        raise DataError(f"{name}: history of {history} rows holds no window of {window} rows")
    start, end = train
    return max(start, end - history), end


def window_starts(present: np.ndarray, length: int, stride: int) -> tuple[np.ndarray, int]:
    """Start rows of one split's windows, every `stride` rows, without those that would cover a
    missing row; and how many of those were left out."""
    starts = np.arange(0, len(present) - length + 1, stride)
    missing_before = np.concatenate([[0], np.cumsum(~present)])
    complete = missing_before[starts + length] == missing_before[starts]
    return starts[complete], int((~complete).sum())


def require_windows(table: SeriesTable, starts: Mapping[str, np.ndarray], lookback: int, horizon: int) -> None:
    """Refuse a table whose gaps leave a split without a single window."""
    empty = [split for split, kept in starts.items() if not len(kept)]
    if empty:
        missing = int((~table.present).sum())
        raise DataError(
            f"{table.name}: no {' or '.join(empty)} window of {lookback} + {horizon} steps without a gap "
            f"({missing} of {table.n_rows} steps miss a value); fill short gaps (fill = 'ffill' or "
            "'interpolate') or use a shorter lookback"
        )


@dataclass(frozen=True, eq=False)
class ClientArrays:
    """One client's split, scaled and windowed data as numpy arrays: ``scaled`` (T, F) float32 and
    ``marks`` (T, 4) over the whole table, each split's row range ``bounds`` [start, end), window
    ``starts`` (rows from the split's start) and ``dropped`` window count, the scaler's ``mean`` and
    ``std``, the ``reference`` rows errors are scaled against (the whole training split), and ``raw``,
    the values in data units (NaN where missing) from the first training row on, with ``period``
    rows per day."""

    name: str
    columns: tuple[str, ...]
    latitude: float | None
    longitude: float | None
    scaled: np.ndarray
    marks: np.ndarray
    bounds: dict[str, tuple[int, int]]
    starts: dict[str, np.ndarray]
    dropped: dict[str, int]
    lookback: int
    horizon: int
    mean: np.ndarray
    std: np.ndarray
    reference: np.ndarray
    raw: np.ndarray
    period: int

    @property
    def train_start(self) -> int:
        """The table row ``raw`` starts at."""
        return self.bounds["train"][0]

    @property
    def history(self) -> np.ndarray:
        """The training rows (data units): what anchors are fitted on."""
        start, end = self.bounds["train"]
        return self.raw[: end - start]

    def origins(self, split: str) -> np.ndarray:
        """Each window's first forecast row in ``split`` as a row of ``raw``."""
        return self.bounds[split][0] - self.train_start + self.starts[split] + self.lookback

    def to_npz(self) -> dict[str, np.ndarray]:
        """The arrays by name and everything else as one JSON entry, for ``np.savez`` (no pickle)."""
        meta = {"name": self.name, "columns": list(self.columns), "latitude": self.latitude,
                "longitude": self.longitude, "bounds": self.bounds, "dropped": self.dropped,
                "lookback": self.lookback, "horizon": self.horizon, "period": self.period}
        arrays = {"scaled": self.scaled, "marks": self.marks, "mean": self.mean, "std": self.std,
                  "reference": self.reference, "raw": self.raw}
        return {META: np.array(json.dumps(meta)), **arrays, **{f"starts.{k}": v for k, v in self.starts.items()}}

    @classmethod
    def from_npz(cls, npz: Mapping[str, np.ndarray]) -> ClientArrays:
        """The arrays ``to_npz`` gave, read back."""
        meta = json.loads(str(npz[META]))
        bounds = {split: (int(a), int(b)) for split, (a, b) in meta.pop("bounds").items()}
        return cls(**meta | {"columns": tuple(meta["columns"]), "bounds": bounds},
                   **{k: npz[k] for k in ("scaled", "marks", "mean", "std", "reference", "raw")},
                   starts={split: npz[f"starts.{split}"] for split in bounds})


def client_arrays(table: SeriesTable, lookback: int, horizon: int, stride: int = 1, ratios: Ratios = RATIOS,
                  val_stride: int = 1, history: int | None = None, test_stride: int = 1) -> ClientArrays:
    """``edge_agent.data.windows.prepare_client``'s arithmetic on numpy arrays (its docstring says what)."""
    from edge_agent.data.table import steps_per_day  # pandas: loaded already with the table

    for name, value in (("stride", stride), ("val_stride", val_stride), ("test_stride", test_stride)):
        if value < 1:
            raise ValueError(f"{table.name}: {name} must be >= 1, got {value}")
    try:
        bounds = split_bounds(table.n_rows, lookback, horizon, ratios)
    except DataError as err:
        raise DataError(f"{table.name}: {err}") from err
    reference = table.values[slice(*bounds["train"])]
    if history is not None:
        bounds["train"] = _recent(table.name, bounds["train"], history, lookback + horizon)
    present = table.present
    strides = {"train": stride, "val": val_stride, "test": test_stride}
    windows = {split: window_starts(present[a:b], lookback + horizon, strides[split]) for split, (a, b) in bounds.items()}
    starts = {split: kept for split, (kept, _) in windows.items()}
    require_windows(table, starts, lookback, horizon)
    train_start, train_end = bounds["train"]
    scaler = StandardScaler().fit(table.values[train_start:train_end][present[train_start:train_end]])
    return ClientArrays(table.name, table.columns, table.latitude, table.longitude,
                        np.ascontiguousarray(scaler.transform(table.values), dtype=np.float32),
                        time_features(table.index), bounds, starts,
                        {split: dropped for split, (_, dropped) in windows.items()}, lookback, horizon,
                        scaler.mean, scaler.std, np.array(reference), np.array(table.values[train_start:], dtype=np.float64),
                        steps_per_day(table))
