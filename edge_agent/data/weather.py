"""Real multi-site hourly weather: the year-long files bundled with pvlib 0.11.2, one SeriesTable per site.

Each site keeps only the canonical variables it really measures: all-NaN columns and columns that are
constant over the year (fill values, e.g. sand_point pressure) are dropped. TMY files stitch months of
different years, so every site is re-indexed in row order onto one calendar (2021, hourly, local
standard time) and all sites align row by row.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType

import numpy as np
import pandas as pd

from edge_agent.data.table import DataError, SeriesTable
from edge_agent.data.variables import WEATHER_VARIABLES

HOURS_PER_YEAR = 8760
CALENDAR = pd.date_range("2021-01-01", periods=HOURS_PER_YEAR, freq="h")
_PVLIB = importlib.util.find_spec("pvlib")
if _PVLIB is None:  # the bundled sites are pvlib's files: the `sites` extra (edgefl.extras names it)
    raise ModuleNotFoundError("No module named 'pvlib' (the bundled weather sites)", name="pvlib")
DATA_DIR = os.path.join(os.path.dirname(_PVLIB.origin), "data")

Reading = tuple[pd.DataFrame, float, float]


def _iotools() -> ModuleType:
    """pvlib's file readers, imported on first read: pvlib costs ~50 MB of memory, and most
    processes that import this module (an agent, through the foundation settings) only need its names."""
    from pvlib import iotools

    return iotools


def _read_tmy3(path: str) -> Reading:
    """TMY3 / SolarAnywhere-TMY3 CSV: pvlib already maps to canonical names; pressure is mbar (= hPa)."""
    data, meta = _iotools().read_tmy3(path, map_variables=True, encoding="iso-8859-1")
    data = data.rename(columns={"DNI (W/m^2))": "dni"})
    return data, meta["latitude"], meta["longitude"]


def _read_tmy2(path: str) -> Reading:
    """TMY2: raw column names; temperatures in 0.1 degC and wind speed in 0.1 m/s."""
    data, meta = _iotools().read_tmy2(path)
    frame = pd.DataFrame({
        "ghi": data["GHI"], "dni": data["DNI"], "dhi": data["DHI"],
        "temp_air": data["DryBulb"] / 10.0, "temp_dew": data["DewPoint"] / 10.0,
        "relative_humidity": data["RHum"], "pressure": data["Pressure"],
        "wind_speed": data["Wspd"] / 10.0, "wind_direction": data["Wdir"],
    })
    return frame, meta["latitude"], meta["longitude"]


def _read_epw(path: str) -> Reading:
    """EPW: canonical names except `atmospheric_pressure`, which is in Pa."""
    data, meta = _iotools().read_epw(path)
    data = data.assign(pressure=data["atmospheric_pressure"] / 100.0)
    return data, meta["latitude"], meta["longitude"]


def _read_psm3(path: str) -> Reading:
    """NSRDB PSM3 at 30-minute steps: keep the on-the-hour rows; pressure is mbar (= hPa)."""
    data, meta = _iotools().read_psm3(path, map_variables=True)
    return data[data.index.minute == 0], meta["latitude"], meta["longitude"]


def _read_pvgis_tmy(path: str) -> Reading:
    """PVGIS TMY: rows are UTC, so roll them to local standard time (UTC+1 at 8 E); pressure is Pa."""
    data, _months, inputs, _meta = _iotools().read_pvgis_tmy(path, map_variables=True)
    lat, lon = inputs.get("latitude", 45.0), inputs.get("longitude", 8.0)
    data = data.assign(pressure=data["pressure"] / 100.0)
    rolled = data.iloc[np.roll(np.arange(len(data)), round(lon / 15))]
    return rolled, lat, lon


@dataclass(frozen=True)
class SiteSpec:
    """Where a site's file lives, how to read it into canonical units, and what is special about it."""

    file: str
    reader: Callable[[str], Reading]
    notes: str = ""


SITES: dict[str, SiteSpec] = {
    "sand_point": SiteSpec("703165TY.csv", _read_tmy3, "TMY3, Sand Point AK; constant fill pressure dropped"),
    "greensboro": SiteSpec("723170TYA.CSV", _read_tmy3, "TMY3, Greensboro NC"),
    "miami": SiteSpec("12839.tm2", _read_tmy2, "TMY2, Miami FL; units converted from 0.1 degC and 0.1 m/s"),
    "amsterdam": SiteSpec("NLD_Amsterdam062400_IWEC.epw", _read_epw, "EPW (IWEC), Amsterdam NL; Pa -> hPa"),
    "craig_co": SiteSpec("test_read_psm3.csv", _read_psm3, "NSRDB PSM3 2017, Craig CO; 30-min rows at minute 0"),
    "pvgis_it": SiteSpec(
        "tmy_45.000_8.000_2005_2023.csv", _read_pvgis_tmy, "PVGIS TMY, Piedmont IT; UTC -> UTC+1, Pa -> hPa"
    ),
    "burlington": SiteSpec(
        "Burlington, United States SolarAnywhere Time Series 2021 Lat_44_465 Lon_-73_205 TMY3 format.csv",
        _read_tmy3,
        "SolarAnywhere TMY3, Burlington VT; no dew point, pressure or wind direction",
    ),
}


def list_sites() -> list[str]:
    """Names of the bundled weather sites, in a fixed order."""
    return list(SITES)


@lru_cache(maxsize=None)
def load_site(site: str) -> SeriesTable:
    """Parse one site into a SeriesTable on the common 2021 hourly calendar (cached: parsing takes ~1 s)."""
    if site not in SITES:
        raise DataError(f"unknown weather site '{site}'; valid sites: {', '.join(SITES)}")
    spec = SITES[site]
    path = os.path.join(DATA_DIR, spec.file)
    if not os.path.isfile(path):
        raise DataError(f"{site}: weather file not found: {path}")
    frame, lat, lon = spec.reader(path)
    return _to_table(site, frame, float(lat), float(lon))


def load_sites(sites: Sequence[str] | None = None) -> list[SeriesTable]:
    """Load several sites (all of them by default), in the order given."""
    return [load_site(s) for s in (list_sites() if sites is None else sites)]


def _to_table(site: str, frame: pd.DataFrame, lat: float, lon: float) -> SeriesTable:
    """Keep informative canonical columns, repair isolated gaps and put the rows on the common calendar."""
    if len(frame) != HOURS_PER_YEAR:
        raise DataError(f"{site}: expected {HOURS_PER_YEAR} hourly rows, got {len(frame)}")
    kept = {}
    for name in WEATHER_VARIABLES:
        if name not in frame.columns:
            continue
        column = pd.to_numeric(frame[name], errors="coerce").astype(np.float64).reset_index(drop=True)
        if column.notna().any() and column.nunique() > 1:
            kept[name] = _fill_isolated(site, name, column)
    if not kept:
        raise DataError(f"{site}: none of {WEATHER_VARIABLES} present")
    values = np.column_stack(list(kept.values()))
    return SeriesTable(site, CALENDAR, values, tuple(kept), lat, lon)


def _fill_isolated(site: str, name: str, column: pd.Series) -> np.ndarray:
    """Linearly interpolate single missing hours; longer gaps or edge gaps raise DataError."""
    column = column.where(np.isfinite(column))
    filled = column.interpolate(limit=1, limit_area="inside")
    gap = column.isna() & (column.isna().shift(1, fill_value=False) | column.isna().shift(-1, fill_value=False))
    left = filled.isna() | gap
    if left.any():
        rows = ", ".join(str(i + 1) for i in np.flatnonzero(left.to_numpy())[:5])
        count = int(left.sum())
        raise DataError(f"{site}: variable '{name}' has {count} missing hours in unfillable gaps (hours {rows})")
    return filled.to_numpy()
