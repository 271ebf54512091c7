"""Coarser resolutions of a table, and a pretraining fleet that mixes resolutions and quantities.

A foundation model pretrained across clients that differ in sampling step and in which physical
quantities they measure meets the dataset bias FeDaL removes (FeDaL, section 1: clients of
different resolutions, ranges and shifts). The same mean-per-interval resampling turns irregular
sensor readings into a model's step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from edge_agent.data.table import DataError, SeriesTable


def resample_mean(table: SeriesTable, step: str | pd.Timedelta) -> SeriesTable:
    """``table`` on a regular grid of ``step`` (a whole multiple of its own step), each cell the
    mean of the observed values in its interval; an interval without any stays missing. Intervals
    start at the first timestamp and are labelled by their start."""
    step, own = pd.Timedelta(step), _step(table)
    if step < own or step % own != pd.Timedelta(0):
        raise DataError(f"{table.name}: cannot resample a {own} series to {step}: "
                        "the new step must be a whole multiple of the current one")
    frame = pd.DataFrame(table.values, index=table.index, columns=list(table.columns))
    coarse = frame.resample(step, origin="start").mean()
    return SeriesTable(f"{table.name}-{_label(step)}", pd.DatetimeIndex(coarse.index), coarse.to_numpy(np.float32),
                       table.columns, table.latitude, table.longitude, coarse.notna().to_numpy())


def mixed_fleet(tables: Sequence[SeriesTable], steps: Sequence[str] = ("1h", "3h", "6h"),
                per_variable: bool = True) -> list[SeriesTable]:
    """Every table at every step in ``steps`` (its own step kept as is), plus, with
    ``per_variable``, one client per measured variable at the table's own step."""
    fleet = []
    for table in tables:
        own = _step(table)
        fleet += [table if pd.Timedelta(s) == own else resample_mean(table, s) for s in steps]
        if per_variable and table.n_features > 1:
            fleet += [_single(table, column) for column in table.columns]
    return fleet


def _single(table: SeriesTable, column: str) -> SeriesTable:
    picked = table.select([column])
    return SeriesTable(f"{table.name}-{column}", picked.index, picked.values, picked.columns, picked.latitude,
                       picked.longitude, picked.observed)


def _step(table: SeriesTable) -> pd.Timedelta:
    if table.n_rows < 2:
        raise DataError(f"{table.name}: one row has no sampling step")
    return pd.Timedelta(pd.Series(table.index).diff().mode().iloc[0])


def _label(step: pd.Timedelta) -> str:
    hours = step / pd.Timedelta(hours=1)
    return f"{hours:g}h" if hours >= 1 else f"{step / pd.Timedelta(minutes=1):g}min"
