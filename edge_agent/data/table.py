"""The in-memory time-series table shared by every data source, and the data error type."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from edge_agent.data.errors import DataError
from edge_agent.data.gaps import Cell, GapPolicy, GapReport, fill_gaps
from edge_agent.times import interval_text

__all__ = ["DataError", "SeriesTable", "check_interval", "sampling_step", "steps_per_day"]


@dataclass(frozen=True, eq=False)
class SeriesTable:
    """A regular multivariate time series: timestamps plus named float columns, with optional site coordinates.

    `values` is stored as a read-only float32 array so cached tables cannot be changed by accident.
    `observed` (same shape, default all True) marks the cells that hold a value; the others are NaN
    and no window may cover their rows. `gaps` is the loader's report of what it found and filled.
    """

    name: str
    index: pd.DatetimeIndex
    values: np.ndarray
    columns: tuple[str, ...]
    latitude: float | None = None
    longitude: float | None = None
    observed: np.ndarray | None = None
    gaps: GapReport | None = None
    ignored: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        values = np.array(self.values, dtype=np.float32, copy=True)
        observed = np.ones(values.shape, dtype=bool) if self.observed is None else np.array(self.observed, dtype=bool)
        if observed.shape != values.shape:
            raise DataError(f"{self.name}: observed mask shape {observed.shape} differs from values {values.shape}")
        values[~observed] = np.nan
        values.flags.writeable = observed.flags.writeable = False
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "observed", observed)
        object.__setattr__(self, "columns", tuple(self.columns))
        self._validate()

    def _validate(self) -> None:
        if not isinstance(self.index, pd.DatetimeIndex):
            raise DataError(f"{self.name}: index must be a DatetimeIndex, got {type(self.index).__name__}")
        if self.values.ndim != 2 or self.values.shape != (len(self.index), len(self.columns)):
            raise DataError(
                f"{self.name}: values shape {self.values.shape} does not match "
                f"{len(self.index)} timestamps x {len(self.columns)} columns"
            )
        if len(set(self.columns)) != len(self.columns):
            raise DataError(f"{self.name}: duplicate column names in {list(self.columns)}")
        if len(self.index) > 1 and not (np.diff(self.index.asi8) > 0).all():
            raise DataError(f"{self.name}: timestamps are not strictly increasing")
        finite = (np.isfinite(self.values) | ~self.observed).all(axis=0)
        if not finite.all():
            bad = [c for c, ok in zip(self.columns, finite) if not ok]
            raise DataError(f"{self.name}: non-finite values in columns {bad}")

    @property
    def n_rows(self) -> int:
        """Number of timestamps T."""
        return len(self.index)

    @property
    def n_features(self) -> int:
        """Number of value columns F."""
        return len(self.columns)

    @property
    def present(self) -> np.ndarray:
        """(T,) bool: rows with a value in every column, the only rows a window may cover."""
        return self.observed.all(axis=1)

    @property
    def notes(self) -> list[str]:
        """What the loader did that the user should hear of: gaps found and filled, text columns left out."""
        gaps = [self.gaps.summary()] if self.gaps and self.gaps.gaps else []
        ignored = [f"ignored {len(self.ignored)} text column(s) {', '.join(map(repr, self.ignored))}: not numbers "
                   "(name the columns to use in [data] columns to silence this)"] if self.ignored else []
        return [f"{self.name}: {note}" for note in gaps + ignored]

    @classmethod
    def on_grid(cls, name: str, index: pd.DatetimeIndex, values: np.ndarray, columns: Sequence[str],
                step: pd.Timedelta, policy: GapPolicy, ignored: Sequence[str] = ()) -> SeriesTable:
        """A table from values on a regular grid whose empty cells (NaN) are kept or filled as
        ``policy`` says, with the report of what was found and filled (CSV files and sensor
        histories alike)."""
        filled, status = fill_gaps(values, policy)
        report = GapReport.of(index, status, step, policy)
        return cls(name, index, filled, tuple(columns), observed=status != Cell.MISSING, gaps=report,
                   ignored=tuple(ignored))

    def select(self, columns: Sequence[str]) -> SeriesTable:
        """Return a table with only `columns`, in the given order; unknown names raise DataError.

        The loader's gap report describes all columns, so the selection does not carry it.
        """
        position = {c: i for i, c in enumerate(self.columns)}
        unknown = [c for c in columns if c not in position]
        if unknown:
            raise DataError(f"{self.name}: unknown columns {unknown}; available: {list(self.columns)}")
        picked = [position[c] for c in columns]
        return SeriesTable(
            self.name, self.index, self.values[:, picked], tuple(columns), self.latitude, self.longitude,
            self.observed[:, picked],
        )


def sampling_step(table: SeriesTable) -> pd.Timedelta:
    """The table's most common interval between rows."""
    if table.n_rows < 2:
        raise DataError(f"{table.name}: one row has no sampling step")
    return pd.Series(table.index).diff().mode().iloc[0]


def steps_per_day(table: SeriesTable) -> int:
    """Rows per day at the table's most common sampling step (24 for hourly data)."""
    return max(1, round(pd.Timedelta(days=1) / sampling_step(table)))


def check_interval(table: SeriesTable, interval_ns: int) -> None:
    """Refuse (DataError, one line) a table whose rows come at another interval than the model's
    ``[model] interval``: its steps would mean other spans (a 24-step season on half-hourly data
    is 12 hours), so the setting to change is named with the value that fits."""
    step = int(sampling_step(table).value)
    if step != interval_ns:
        raise DataError(f"{table.name}: rows come every {interval_text(step)} but the model's interval is "
                        f"{interval_text(interval_ns)}: set [model] interval = \"{interval_text(step)}\" "
                        "(or --interval; the fleet's coordinator and every gateway use one)")
