"""Coarser resolutions (mean per interval, missing stays missing) and the mixed pretraining fleet."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from edge_agent.data import DataError, SeriesTable, load_site
from edge_agent.data.canonical import device_series
from edge_agent.data.resample import mixed_fleet, resample_mean
from edge_agent.models.foundation_config import FoundationConfig


def hourly(values: list[list[float]], observed: list[list[bool]] | None = None) -> SeriesTable:
    index = pd.date_range("2024-01-01", periods=len(values), freq="h")
    return SeriesTable("s", index, np.array(values, dtype=np.float32), ("a", "b"), 52.0, 4.9,
                       None if observed is None else np.array(observed))


def test_each_interval_is_the_mean_of_its_observed_values_and_an_empty_one_stays_missing() -> None:
    table = hourly([[1, 10], [2, 20], [3, 30], [4, 40], [5, 50], [6, 60], [7, 70], [8, 80], [9, 90]],
                   [[True, True], [True, False], [True, True], [False, True], [False, True], [False, True],
                    [True, True], [True, True], [True, True]])
    coarse = resample_mean(table, "3h")
    assert coarse.name == "s-3h" and coarse.columns == ("a", "b")
    assert list(coarse.index) == list(pd.date_range("2024-01-01", periods=3, freq="3h"))
    np.testing.assert_allclose(coarse.values[0], [2.0, 20.0])  # b: (10 + 30) / 2, the 20 was missing
    assert not coarse.observed[1, 0] and np.isnan(coarse.values[1, 0])
    np.testing.assert_allclose(coarse.values[1, 1], 50.0)
    np.testing.assert_allclose(coarse.values[2], [8.0, 80.0])
    assert (coarse.latitude, coarse.longitude) == (52.0, 4.9)


@pytest.mark.parametrize("step", ["30min", "90min"])
def test_a_step_that_is_not_a_whole_multiple_is_refused(step: str) -> None:
    with pytest.raises(DataError, match="whole multiple"):
        resample_mean(hourly([[1, 1], [2, 2], [3, 3]]), step)


def test_the_mixed_fleet_holds_every_resolution_and_one_client_per_variable() -> None:
    site = load_site("amsterdam")
    fleet = mixed_fleet([site], ("1h", "6h"), per_variable=True)
    names = [t.name for t in fleet]
    assert names == ["amsterdam", "amsterdam-6h", *(f"amsterdam-{c}" for c in site.columns)]
    assert fleet[0] is site and fleet[1].n_rows == site.n_rows // 6
    assert mixed_fleet([site], ("1h",), per_variable=False) == [site]


def test_mixed_clients_window_onto_the_foundation_layout() -> None:
    fm = FoundationConfig(window=24)
    site = load_site("amsterdam")
    single, coarse = mixed_fleet([site], ("6h",), per_variable=True)[1], resample_mean(site, "6h")
    one = device_series(single, fm.variables, fm.window, stride=24)
    assert one.present.sum() == 1 and one.present[fm.variables.index(site.columns[0])]
    assert device_series(coarse, fm.variables, fm.window, stride=4).train.shape[1:] == (24, len(fm.variables))


def test_the_extra_series_add_a_finer_resolution_and_other_physical_quantities() -> None:
    from edge_agent.data.extra import craig_co_half_hourly, particulates
    from edge_agent.data.variables import EXTRA_VARIABLES

    half_hourly, dust = craig_co_half_hourly(), particulates()
    assert half_hourly.n_rows == 2 * 8760 and (half_hourly.index[1] - half_hourly.index[0]) == pd.Timedelta("30min")
    assert half_hourly.index.tz is None and "temp_air" in half_hourly.columns
    assert dust.columns == EXTRA_VARIABLES and dust.n_rows == 8760
    assert 1 < float(np.nanmean(dust.values[:, 1])) < 500  # PM2.5 in micrograms per cubic metre
