"""Data layer: CSV and bundled-weather loaders, synthetic series, feature pools, windows and scaling.

Names are loaded on first use (PEP 562): ``from edge_agent.data import DataError`` imports only
``edge_agent.data.errors``, so the serving-only process reads its sensors without pulling in torch
(``windows``), pvlib (``weather``) or pandas (``table``), and the training process builds its
windows from prepared arrays (``arrays``) without pandas."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "arrays": ("ClientArrays", "StandardScaler", "client_arrays", "min_training_rows", "split_bounds", "time_features"),
    "csv": ("load_csv", "load_csv_sites"),
    "errors": ("DataError",),
    "fleet": ("feature_clients", "site_clients"),
    "gateways": ("load_gateways",),
    "gaps": ("Cell", "GapPolicy", "GapReport", "fill_gaps"),
    "pool": ("allocate_features", "build_pool", "client_tables", "feature_sites", "site_coordinates"),
    "synthetic": ("synthetic_clients", "synthetic_table"),
    "table": ("SeriesTable", "check_interval", "sampling_step", "steps_per_day"),
    "variables": ("WEATHER_VARIABLES",),
    "weather": ("SITES", "SiteSpec", "list_sites", "load_site", "load_sites"),
    "windows": ("TIME_FEATURES", "ClientData", "WindowSet", "client_data", "prepare_client"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}
__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:
    from edge_agent.data.arrays import (
        ClientArrays,
        StandardScaler,
        client_arrays,
        min_training_rows,
        split_bounds,
        time_features,
    )
    from edge_agent.data.csv import load_csv, load_csv_sites
    from edge_agent.data.errors import DataError
    from edge_agent.data.fleet import feature_clients, site_clients
    from edge_agent.data.gateways import load_gateways
    from edge_agent.data.gaps import Cell, GapPolicy, GapReport, fill_gaps
    from edge_agent.data.pool import allocate_features, build_pool, client_tables, feature_sites, site_coordinates
    from edge_agent.data.synthetic import synthetic_clients, synthetic_table
    from edge_agent.data.table import SeriesTable, check_interval, sampling_step, steps_per_day
    from edge_agent.data.variables import WEATHER_VARIABLES
    from edge_agent.data.weather import SITES, SiteSpec, list_sites, load_site, load_sites
    from edge_agent.data.windows import TIME_FEATURES, ClientData, WindowSet, client_data, prepare_client


def __getattr__(name: str) -> Any:
    """The public name ``name`` from the submodule that defines it, imported now."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
