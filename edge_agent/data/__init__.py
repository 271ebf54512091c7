"""Data layer: CSV and bundled-weather loaders, synthetic series, feature pools, windows and scaling."""

from edge_agent.data.csv import load_csv
from edge_agent.data.fleet import feature_clients
from edge_agent.data.gaps import Cell, GapPolicy, GapReport, fill_gaps
from edge_agent.data.pool import allocate_features, build_pool, client_tables, feature_sites, site_coordinates
from edge_agent.data.synthetic import synthetic_clients, synthetic_table
from edge_agent.data.table import DataError, SeriesTable, steps_per_day
from edge_agent.data.weather import SITES, WEATHER_VARIABLES, SiteSpec, list_sites, load_site, load_sites
from edge_agent.data.windows import (
    TIME_FEATURES,
    ClientData,
    StandardScaler,
    WindowSet,
    min_training_rows,
    prepare_client,
    split_bounds,
    time_features,
)

__all__ = [
    "SITES",
    "TIME_FEATURES",
    "WEATHER_VARIABLES",
    "Cell",
    "ClientData",
    "DataError",
    "GapPolicy",
    "GapReport",
    "SeriesTable",
    "steps_per_day",
    "SiteSpec",
    "StandardScaler",
    "WindowSet",
    "allocate_features",
    "build_pool",
    "client_tables",
    "feature_clients",
    "feature_sites",
    "fill_gaps",
    "list_sites",
    "load_csv",
    "load_site",
    "load_sites",
    "min_training_rows",
    "prepare_client",
    "site_coordinates",
    "split_bounds",
    "synthetic_clients",
    "synthetic_table",
    "time_features",
]
