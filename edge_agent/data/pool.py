"""Feature-level non-IID clients (FedQAPer section 3.1): each client gets a random subset of a universal pool."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from edge_agent.data.table import DataError, SeriesTable

SEPARATOR = "/"


def build_pool(tables: Sequence[SeriesTable]) -> SeriesTable:
    """Stack site tables side by side into the universal pool; columns are named '<site>/<variable>'."""
    if not tables:
        raise DataError("build_pool: no tables given")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise DataError(f"build_pool: duplicate table names in {names}")
    reference = tables[0]
    for table in tables[1:]:
        if not table.index.equals(reference.index):
            raise DataError(f"build_pool: '{table.name}' has a different time index than '{reference.name}'")
    columns = tuple(f"{t.name}{SEPARATOR}{c}" for t in tables for c in t.columns)
    values = np.concatenate([t.values for t in tables], axis=1)
    observed = np.concatenate([t.observed for t in tables], axis=1)
    return SeriesTable("pool", reference.index, values, columns, observed=observed)


def feature_sites(pool: SeriesTable) -> list[str]:
    """The site each pool column came from (the part of its name before the last '/')."""
    unnamed = [c for c in pool.columns if SEPARATOR not in c]
    if unnamed:
        raise DataError(f"{pool.name}: columns {unnamed} are not of the form '<site>/<variable>'")
    return [c.rsplit(SEPARATOR, 1)[0] for c in pool.columns]


def site_coordinates(tables: Sequence[SeriesTable]) -> dict[str, tuple[float, float]]:
    """Map each table name to (latitude, longitude); tables without coordinates are left out."""
    return {
        t.name: (t.latitude, t.longitude) for t in tables if t.latitude is not None and t.longitude is not None
    }


def allocate_features(n_features: int, n_clients: int, f_max: int, seed: int) -> list[list[int]]:
    """Draw each client's sorted feature indices independently, without coordination.

    Subset size ~ U{1..min(f_max, n_features)}, then that many distinct features (FedQAPer section 3.1).
    """
    for arg, value in (("n_features", n_features), ("n_clients", n_clients), ("f_max", f_max)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"allocate_features: {arg} must be a positive integer, got {value!r}")
    rng = np.random.default_rng(seed)
    upper = min(f_max, n_features)
    allocation = []
    for _ in range(n_clients):
        size = int(rng.integers(1, upper + 1))
        allocation.append(sorted(int(i) for i in rng.choice(n_features, size, replace=False)))
    return allocation


def client_tables(pool: SeriesTable, allocation: list[list[int]]) -> list[SeriesTable]:
    """One table per client with its allocated pool columns, named client00, client01, ..."""
    width = max(2, len(str(len(allocation) - 1)))
    clients = []
    for k, features in enumerate(allocation):
        name = f"client{k:0{width}d}"
        _check_features(name, features, pool.n_features)
        columns = tuple(pool.columns[i] for i in features)
        clients.append(replace(pool.select(columns), name=name))
    return clients


def _check_features(name: str, features: Sequence[int], n_features: int) -> None:
    """Reject empty, repeated or out-of-range feature indices for one client."""
    if not features:
        raise DataError(f"{name}: empty feature list")
    if len(set(features)) != len(features):
        raise DataError(f"{name}: repeated feature indices {list(features)}")
    outside = [i for i in features if not 0 <= i < n_features]
    if outside:
        raise DataError(f"{name}: feature indices {outside} outside the pool's 0..{n_features - 1}")
