"""More real series shipped with pvlib 0.11.2, for a pretraining fleet whose dataset bias is real
(FeDaL, section 1: clients that differ in resolution and in the physical quantities they measure):

- ``craig_co-30min``: the NSRDB PSM3 file behind the ``craig_co`` site at its native 30-minute
  step (the bundled site keeps the on-the-hour rows);
- ``particulates``: hourly rain and PM2.5 / PM10 concentrations for 2015, the inputs of pvlib's
  HSU soiling example (``soiling_hsu_example_inputs.csv``; the package does not say where they
  were measured). Quantities no weather station has: the foundation layout must include
  ``EXTRA_VARIABLES`` (``edge_agent.data.variables``) to take them.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from pvlib import iotools

from edge_agent.data.table import DataError, SeriesTable
from edge_agent.data.variables import WEATHER_VARIABLES
from edge_agent.data.weather import DATA_DIR, SITES

PARTICULATES_FILE = "soiling_hsu_example_inputs.csv"
GRAMS_TO_MICROGRAMS = 1e6


def craig_co_half_hourly() -> SeriesTable:
    """Craig CO, 2017, every 30 minutes, the canonical variables that vary (local standard time)."""
    path = _path(SITES["craig_co"].file)
    data, meta = iotools.read_psm3(path, map_variables=True)
    columns = [c for c in WEATHER_VARIABLES if c in data.columns and data[c].nunique() > 1]
    index = pd.DatetimeIndex(data.index.tz_localize(None))
    return _table("craig_co-30min", index, data[columns], float(meta["latitude"]), float(meta["longitude"]))


def particulates() -> SeriesTable:
    """Hourly precipitation (mm) and PM2.5 / PM10 (micrograms per cubic metre), 2015."""
    frame = pd.read_csv(_path(PARTICULATES_FILE), index_col=0, parse_dates=True)
    values = pd.DataFrame({"precipitation": frame["rain"], "pm2_5": frame["PM2_5"] * GRAMS_TO_MICROGRAMS,
                           "pm10": frame["PM10"] * GRAMS_TO_MICROGRAMS})
    return _table("particulates", pd.DatetimeIndex(frame.index), values, None, None)


def extra_series() -> list[SeriesTable]:
    """Every extra series, in a fixed order."""
    return [craig_co_half_hourly(), particulates()]


def _path(name: str) -> str:
    path = os.path.join(DATA_DIR, name)
    if not os.path.isfile(path):
        raise DataError(f"pvlib data file not found: {path}")
    return path


def _table(name: str, index: pd.DatetimeIndex, frame: pd.DataFrame, lat: float | None,
           lon: float | None) -> SeriesTable:
    values = frame.to_numpy(np.float32)
    if not np.isfinite(values).all():
        raise DataError(f"{name}: {int((~np.isfinite(values)).sum())} missing or non-finite values")
    return SeriesTable(name, index, values, tuple(frame.columns), lat, lon)
