"""A simulated fleet: clients carved out of a feature pool, ready for training."""

from __future__ import annotations

from edge_agent.data.pool import allocate_features, client_tables
from edge_agent.data.table import DataError, SeriesTable
from edge_agent.data.arrays import split_bounds
from edge_agent.data.windows import ClientData, prepare_client


def feature_clients(
    pool: SeriesTable,
    n_clients: int,
    f_max: int,
    seed: int,
    lookback: int,
    horizon: int,
    stride: int = 1,
    val_stride: int = 1,
    history: int | None = None,
) -> list[ClientData]:
    """Feature-level non-IID clients (FedQAPer 3.1), windowed, split and scaled per client
    (``history``: training rows each client keeps, see ``prepare_client``).

    The pool's length is checked first so a short file is reported by its own name.
    """
    try:
        split_bounds(pool.n_rows, lookback, horizon)
    except DataError as err:
        raise DataError(f"{pool.name}: {err}") from err
    allocation = allocate_features(pool.n_features, n_clients, f_max, seed)
    return [
        prepare_client(table, lookback, horizon, stride, val_stride=val_stride, history=history)
        for table in client_tables(pool, allocation)
    ]


def site_clients(
    tables: list[SeriesTable], lookback: int, horizon: int, stride: int = 1, history: int | None = None
) -> list[ClientData]:
    """One client per site's table (``edge_agent.data.gateways``), windowed, split and scaled as
    ``feature_clients`` does its clients: the fleet real multi-site data makes, with no feature draw."""
    return [prepare_client(table, lookback, horizon, stride, history=history) for table in tables]
