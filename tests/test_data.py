"""Tests for edge_agent.data: real CSV files in tmp_path, bundled pvlib weather, pools, synthetic data, windows."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.data import (
    SITES,
    TIME_FEATURES,
    WEATHER_VARIABLES,
    DataError,
    SeriesTable,
    StandardScaler,
    allocate_features,
    build_pool,
    client_tables,
    feature_sites,
    list_sites,
    load_csv,
    load_site,
    load_sites,
    prepare_client,
    site_coordinates,
    split_bounds,
    synthetic_clients,
    synthetic_table,
    time_features,
)

ETT_COLUMNS = ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]


def _ett_rows(n: int = 50) -> list[str]:
    """An ETTh1-like file body: header plus `n` hourly rows."""
    dates = pd.date_range("2016-07-01", periods=n, freq="h")
    rows = ["date," + ",".join(ETT_COLUMNS)]
    rows += [f"{d:%Y-%m-%d %H:%M:%S}," + ",".join(f"{i * 0.5 + k:.3f}" for k in range(7)) for i, d in enumerate(dates)]
    return rows


def _write(tmp_path: Path, rows: list[str], name: str = "ETTh1.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return path


def _replace_cell(rows: list[str], line: int, column: int, value: str) -> list[str]:
    """Copy of `rows` with field `column` of file line `line` (header = line 1) set to `value`."""
    rows = list(rows)
    fields = rows[line - 1].split(",")
    fields[column] = value
    rows[line - 1] = ",".join(fields)
    return rows


# ---------------------------------------------------------------- CSV


def test_csv_happy_path(tmp_path: Path) -> None:
    table = load_csv(_write(tmp_path, _ett_rows()))
    assert table.name == "ETTh1.csv"
    assert table.columns == tuple(ETT_COLUMNS)
    assert (table.n_rows, table.n_features) == (50, 7)
    assert table.values.dtype == np.float32
    assert table.index[0] == pd.Timestamp("2016-07-01 00:00") and table.index[-1] == pd.Timestamp("2016-07-03 01:00")
    np.testing.assert_allclose(table.values[3], [1.5 + k for k in range(7)])
    assert table.latitude is None and table.longitude is None


def test_csv_column_subset_date_column_and_text_columns(tmp_path: Path) -> None:
    rows = [r.replace("date,", "Timestamp,", 1) for r in _ett_rows(10)]
    rows = [rows[0] + ",station"] + [r + ",north" for r in rows[1:]]
    path = _write(tmp_path, rows, "custom.csv")
    assert load_csv(path).columns == tuple(ETT_COLUMNS)
    picked = load_csv(path, date_column="Timestamp", columns=["OT", "HUFL"])
    assert picked.columns == ("OT", "HUFL")
    np.testing.assert_allclose(picked.values[:, 1], load_csv(path).values[:, 0])


def test_csv_case_insensitive_date_not_first(tmp_path: Path) -> None:
    path = _write(tmp_path, ["a,DATE", "1,2021-01-01", "2,2021-01-02"], "x.csv")
    table = load_csv(path)
    assert table.columns == ("a",) and table.index[1] == pd.Timestamp("2021-01-02")


def test_csv_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    rows = _ett_rows(10)
    rows.insert(3, "")
    rows = _replace_cell(rows, 8, 7, "")
    with pytest.raises(DataError, match=r"column 'OT' has 1 NaN/inf values at lines 8 \(header is line 1\)"):
        load_csv(_write(tmp_path, rows))


def test_csv_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^nope\.csv: file not found"):
        load_csv(tmp_path / "nope.csv")


def test_csv_empty_and_header_only(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(DataError, match=r"^empty\.csv: file is empty"):
        load_csv(tmp_path / "empty.csv")


@pytest.mark.parametrize(("rows", "name", "message"), [
    (["date,OT"], "head.csv", r"^head\.csv: no data rows"),
    (["date,OT", "2021-01-01,1", "2021-01-02,1,2,3"], "ragged.csv", r"^ragged\.csv: not a readable CSV file"),
    (["date;OT", "2021-01-01;1"], "semi.csv", r"^semi\.csv: only one column \('date;OT'\)"),
    (["date,OT", "2021-01-01,1", "2021-01-02,1e50"], "big.csv",
     r"^big\.csv: column 'OT' has 1 values beyond float32 range, first at line 3"),
    (["idx,OT", "1,2.0", "2,3.0"], "n.csv", r"^n\.csv: date column 'idx' holds numbers"),
    (["date,site", "2021-01-01,a", "2021-01-02,b"], "text.csv",
     r"^text\.csv: no numeric columns besides the date column 'date'"),
])
def test_csv_refused_with_the_file_and_the_reason(tmp_path: Path, rows: list[str], name: str, message: str) -> None:
    with pytest.raises(DataError, match=message):
        load_csv(_write(tmp_path, rows, name))


def test_csv_date_column_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^ETTh1\.csv: date column 'timestamp' not found"):
        load_csv(_write(tmp_path, _ett_rows(5)), date_column="timestamp")


def test_csv_unparsable_dates(tmp_path: Path) -> None:
    rows = _replace_cell(_ett_rows(), 5, 0, "not-a-date")
    expected = r"^ETTh1\.csv: date column 'date' has 1 unparsable values: line 5 \('not-a-date'\)"
    with pytest.raises(DataError, match=expected):
        load_csv(_write(tmp_path, rows))


def test_csv_duplicate_dates(tmp_path: Path) -> None:
    rows = _replace_cell(_ett_rows(), 6, 0, "2016-07-01 03:00:00")
    expected = r"^ETTh1\.csv: dates are duplicated at 1 rows: line 6 \(2016-07-01 03:00:00\) after line 5"
    with pytest.raises(DataError, match=expected):
        load_csv(_write(tmp_path, rows))


def test_csv_decreasing_dates(tmp_path: Path) -> None:
    rows = _replace_cell(_ett_rows(), 6, 0, "2016-06-01 00:00:00")
    with pytest.raises(DataError, match=r"^ETTh1\.csv: dates are not strictly increasing at 1 rows: line 6"):
        load_csv(_write(tmp_path, rows))


def test_csv_requested_column_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^ETTh1\.csv: requested columns \['XX'\] not found"):
        load_csv(_write(tmp_path, _ett_rows(5)), columns=["OT", "XX"])


def test_csv_non_numeric_values(tmp_path: Path) -> None:
    path = _write(tmp_path, _replace_cell(_ett_rows(), 7, 7, "abc"))
    expected = r"^ETTh1\.csv: column 'OT' has 1 non-numeric values: line 7 \('abc'\) \(header is line 1\)"
    with pytest.raises(DataError, match=expected):
        load_csv(path, columns=["OT"])
    with pytest.raises(DataError, match=expected):
        load_csv(path)


def test_csv_nan_and_inf(tmp_path: Path) -> None:
    rows = _ett_rows()
    for line in (10, 11, 47, 30, 31, 32):
        rows = _replace_cell(rows, line, 7, "")
    rows = _replace_cell(rows, 20, 1, "inf")
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, rows))
    message = str(caught.value)
    assert message.startswith("ETTh1.csv: ")
    assert "column 'HUFL' has 1 NaN/inf values at lines 20" in message
    assert "column 'OT' has 6 NaN/inf values at lines 10, 11, 30, 31, 32, ..." in message


# ---------------------------------------------------------------- SeriesTable


def test_table_select_and_validation() -> None:
    table = synthetic_table(3, 10, seed=0)
    assert table.select(["f2", "f0"]).columns == ("f2", "f0")
    np.testing.assert_array_equal(table.select(["f1"]).values[:, 0], table.values[:, 1])
    with pytest.raises(DataError, match=r"synthetic: unknown columns \['zz'\]"):
        table.select(["f0", "zz"])
    with pytest.raises(ValueError):
        table.values[0, 0] = 1.0
    with pytest.raises(DataError, match="not strictly increasing"):
        SeriesTable("t", table.index[::-1], table.values, table.columns)
    with pytest.raises(DataError, match="non-finite values in columns \\['a'\\]"):
        SeriesTable("t", table.index[:2], np.array([[np.nan], [1.0]]), ("a",))


# ---------------------------------------------------------------- weather

EXPECTED_VARIABLES = {
    "sand_point": set(WEATHER_VARIABLES) - {"pressure"},
    "greensboro": set(WEATHER_VARIABLES),
    "miami": set(WEATHER_VARIABLES),
    "amsterdam": set(WEATHER_VARIABLES),
    "craig_co": set(WEATHER_VARIABLES),
    "pvgis_it": set(WEATHER_VARIABLES) - {"temp_dew"},
    "burlington": set(WEATHER_VARIABLES) - {"temp_dew", "pressure", "wind_direction"},
}
RANGES = {
    "ghi": (0, 1500), "dni": (0, 1500), "dhi": (0, 1000), "temp_air": (-50, 60), "temp_dew": (-60, 40),
    "relative_humidity": (0, 100.5), "pressure": (700, 1100), "wind_speed": (0, 60), "wind_direction": (0, 360),
}


@pytest.fixture(scope="module")
def sites() -> list[SeriesTable]:
    return load_sites()


def test_weather_sites_load_and_align(sites: list[SeriesTable]) -> None:
    assert [t.name for t in sites] == list_sites() == list(SITES) == list(EXPECTED_VARIABLES)
    calendar = pd.date_range("2021-01-01", periods=8760, freq="h")
    for table in sites:
        assert table.index.equals(calendar)
        assert table.values.shape == (8760, table.n_features) and np.isfinite(table.values).all()
        assert -90 <= table.latitude <= 90 and -180 <= table.longitude <= 180
        assert set(table.columns) == EXPECTED_VARIABLES[table.name], table.name
        assert list(table.columns) == [v for v in WEATHER_VARIABLES if v in table.columns]
    assert load_site("craig_co").latitude == pytest.approx(40.53)
    assert load_site("sand_point").longitude == pytest.approx(-160.517)


def test_weather_plausible_ranges(sites: list[SeriesTable]) -> None:
    for table in sites:
        for j, column in enumerate(table.columns):
            low, high = RANGES[column]
            assert low <= table.values[:, j].min() and table.values[:, j].max() <= high, (table.name, column)
            assert table.values[:, j].std() > 0
        if "pressure" in table.columns and table.name != "craig_co":
            assert 800 <= table.values[:, table.columns.index("pressure")].min()


def test_weather_local_noon(sites: list[SeriesTable]) -> None:
    """Rows are local standard time: the mean GHI profile peaks around noon at every site."""
    for table in sites:
        ghi = table.values[:, table.columns.index("ghi")]
        profile = [ghi[table.index.hour == h].mean() for h in range(24)]
        assert 11 <= int(np.argmax(profile)) <= 13, table.name
        assert profile[0] < 1.0, table.name


def test_weather_unknown_site_and_cache() -> None:
    with pytest.raises(DataError, match=r"unknown weather site 'mars'; valid sites: sand_point, greensboro"):
        load_site("mars")
    assert load_site("miami") is load_site("miami")
    assert [t.name for t in load_sites(["miami", "amsterdam"])] == ["miami", "amsterdam"]


# ---------------------------------------------------------------- pool and allocation


def test_pool_from_weather(sites: list[SeriesTable]) -> None:
    pool = build_pool(sites)
    assert pool.n_features == sum(t.n_features for t in sites) == 58
    assert pool.latitude is None and pool.longitude is None
    assert pool.columns[0] == "sand_point/ghi" and "burlington/wind_speed" in pool.columns
    assert feature_sites(pool)[:8] == ["sand_point"] * 8
    j = pool.columns.index("miami/temp_air")
    np.testing.assert_array_equal(pool.values[:, j], load_site("miami").select(["temp_air"]).values[:, 0])
    coords = site_coordinates(sites)
    assert coords["pvgis_it"] == (45.0, 8.0) and len(coords) == 7


def test_pool_index_mismatch() -> None:
    a, b = synthetic_table(2, 20, 0, name="a"), synthetic_table(2, 21, 0, name="b")
    with pytest.raises(DataError, match="'b' has a different time index than 'a'"):
        build_pool([a, b])
    with pytest.raises(DataError, match="duplicate table names"):
        build_pool([a, a])


def test_allocation_properties() -> None:
    allocation = allocate_features(58, 20, 20, seed=42)
    assert len(allocation) == 20
    for features in allocation:
        assert 1 <= len(features) <= 20
        assert features == sorted(set(features)) and all(0 <= i < 58 for i in features)
    assert allocate_features(58, 20, 20, seed=42) == allocation
    assert allocate_features(58, 20, 20, seed=7) != allocation
    assert all(len(f) <= 3 for f in allocate_features(3, 50, 20, seed=1))
    assert {len(f) for f in allocate_features(100, 300, 5, seed=0)} == {1, 2, 3, 4, 5}


def test_allocation_paper_default_is_pinned() -> None:
    """N=20, F_max=20, seed 42 over the 58-feature weather pool: pinned so reruns see identical clients."""
    allocation = allocate_features(58, 20, 20, seed=42)
    assert [len(f) for f in allocation] == [2, 9, 4, 10, 16, 4, 9, 10, 12, 19, 14, 9, 14, 20, 11, 5, 20, 15, 9, 9]
    rng = np.random.default_rng(42)
    first = sorted(rng.choice(58, int(rng.integers(1, 21)), replace=False).tolist())
    assert allocation[0] == first


def test_allocation_argument_errors() -> None:
    for arg, bad in (("n_features", 0), ("n_clients", -1), ("f_max", 0)):
        with pytest.raises(ValueError, match=f"{arg} must be a positive integer"):
            allocate_features(**{"n_features": 5, "n_clients": 3, "f_max": 2, "seed": 0, arg: bad})


def test_client_tables(sites: list[SeriesTable]) -> None:
    pool = build_pool(sites)
    allocation = allocate_features(pool.n_features, 20, 20, seed=42)
    clients = client_tables(pool, allocation)
    assert [c.name for c in clients[:3]] == ["client00", "client01", "client02"] and clients[-1].name == "client19"
    for client, features in zip(clients, allocation):
        assert client.columns == tuple(pool.columns[i] for i in features)
        np.testing.assert_array_equal(client.values, pool.values[:, features])
    with pytest.raises(DataError, match=r"client01: feature indices \[99\] outside"):
        client_tables(pool, [[0], [1, 99]])


# ---------------------------------------------------------------- synthetic


def test_synthetic_deterministic_and_shaped() -> None:
    table = synthetic_table(300, 10_000, seed=3)
    assert table.values.shape == (10_000, 300) and table.values.dtype == np.float32
    assert table.index[0] == pd.Timestamp("2021-01-01") and table.columns[:2] == ("f000", "f001")
    np.testing.assert_array_equal(table.values, synthetic_table(300, 10_000, seed=3).values)
    assert not np.array_equal(table.values, synthetic_table(300, 10_000, seed=4).values)
    shifted = synthetic_table(300, 10_000, seed=3, shift=1.0)
    assert (shifted.values.mean(0) > table.values.mean(0)).all()
    assert (shifted.values.std(0) > table.values.std(0)).all()


def test_synthetic_clients_differ() -> None:
    clients = synthetic_clients(4, 5, 500, seed=1)
    assert [c.name for c in clients] == ["client00", "client01", "client02", "client03"]
    means = [c.values.mean() for c in clients]
    assert means == sorted(means) and len(set(means)) == 4
    np.testing.assert_array_equal(clients[2].values, synthetic_clients(4, 5, 500, seed=1)[2].values)


# ---------------------------------------------------------------- windows


def test_time_features() -> None:
    index = pd.DatetimeIndex(["2021-01-01 00:00", "2021-12-31 23:00"])
    features = time_features(index)
    assert features.shape == (2, TIME_FEATURES) and features.dtype == np.float32
    friday = 2 * np.pi * 4 / 7  # both dates are Fridays
    np.testing.assert_allclose(features[0], [0.0, 1.0, np.sin(friday), np.cos(friday)], atol=1e-6)
    late = 2 * np.pi * 23 / 24
    week = 2 * np.pi * (4 + 23 / 24) / 7
    np.testing.assert_allclose(features[1], [np.sin(late), np.cos(late), np.sin(week), np.cos(week)], atol=1e-6)


def test_split_bounds() -> None:
    assert split_bounds(1000, 96, 48) == {"train": (0, 800), "val": (704, 900), "test": (804, 1000)}


def test_split_bounds_minimum_rows() -> None:
    lookback, horizon = 96, 48
    with pytest.raises(DataError) as caught:
        split_bounds(300, lookback, horizon)
    needed = int(str(caught.value).split("needs at least ")[1].split()[0])
    assert str(caught.value) == f"needs at least {needed} rows for lookback 96 + horizon 48 (has 300)"
    assert needed == 480  # val and test each need 48 rows: int(0.1 * n) >= 48


@pytest.mark.parametrize(("lookback", "horizon"), [(1, 1), (5, 3), (2, 7), (96, 48), (336, 96)])
def test_split_bounds_minimum_is_exact(lookback: int, horizon: int) -> None:
    """The reported minimum N fails at N - 1 and works for every length from N on."""
    with pytest.raises(DataError) as caught:
        split_bounds(1, lookback, horizon)
    needed = int(str(caught.value).split("needs at least ")[1].split()[0])
    with pytest.raises(DataError, match=f"needs at least {needed} rows"):
        split_bounds(needed - 1, lookback, horizon)
    for n in range(needed, needed + 300):
        bounds = split_bounds(n, lookback, horizon)
        assert all(end - start >= lookback + horizon for start, end in bounds.values())


def test_scaler_roundtrip_and_constant_column() -> None:
    values = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]], dtype=np.float32)
    scaler = StandardScaler().fit(values)
    np.testing.assert_allclose(scaler.std, [math.sqrt(8 / 3), 1.0], rtol=1e-6)
    np.testing.assert_allclose(scaler.inverse_transform(scaler.transform(values)), values, rtol=1e-6)
    restored = StandardScaler.from_dict(json.loads(json.dumps(scaler.to_dict())))
    np.testing.assert_array_equal(restored.mean, scaler.mean)
    tensor = torch.from_numpy(values)
    torch.testing.assert_close(restored.transform(tensor), torch.from_numpy(scaler.transform(values)))
    with pytest.raises(DataError, match="scaler"):
        StandardScaler.from_dict({"mean": [0.0, 1.0], "std": [1.0]})


def _trend_table(n_rows: int = 1000) -> SeriesTable:
    values = np.stack([np.arange(n_rows), np.sin(np.arange(n_rows) / 5.0)], axis=1)
    return SeriesTable("trend", pd.date_range("2021-01-01", periods=n_rows, freq="h"), values, ("up", "wave"))


def test_prepare_client_scales_on_train_only() -> None:
    data = prepare_client(_trend_table(), lookback=96, horizon=48)
    train_rows = data.train.series.numpy()
    np.testing.assert_allclose(train_rows.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(train_rows.std(0), 1.0, atol=1e-4)
    assert data.test.series[:, 0].mean() > 2.0
    np.testing.assert_allclose(data.scaler.mean[0], 399.5)
    assert (data.name, data.n_features, data.columns) == ("trend", 2, ("up", "wave"))


def test_prepare_client_windows_match_manual_slicing() -> None:
    table = _trend_table()
    data = prepare_client(table, lookback=96, horizon=48, stride=3)
    scaled = data.scaler.transform(table.values)
    marks = time_features(table.index)
    assert len(data.train) == data.n_train == len(range(0, 800 - 144 + 1, 3))
    assert len(data.val) == 900 - 704 - 144 + 1 and len(data.test) == 1000 - 804 - 144 + 1
    for split, offset in (("train", 0), ("val", 704), ("test", 804)):
        windows = getattr(data, split)
        positions = torch.tensor([0, 5, len(windows) - 1])
        x, t, y = windows.batch(positions)
        assert x.shape == (3, 96, 2) and t.shape == (3, 96, 4) and y.shape == (3, 48, 2)
        assert x.dtype == t.dtype == y.dtype == torch.float32
        for row, p in enumerate(positions.tolist()):
            start = offset + int(windows.starts[p])
            np.testing.assert_array_equal(x[row].numpy(), scaled[start : start + 96])
            np.testing.assert_array_equal(t[row].numpy(), marks[start : start + 96])
            np.testing.assert_array_equal(y[row].numpy(), scaled[start + 96 : start + 144])
    assert int(data.test.starts[-1]) + 144 == 1000 - 804


def _first_values(batches: Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """First value of every window, in iteration order: identifies windows of a monotone series."""
    return torch.cat([x[:, 0, 0] for x, _, _ in batches])


def test_batches_cover_every_window_once() -> None:
    data = prepare_client(_trend_table(), lookback=24, horizon=12)
    ordered = torch.cat([x[:, 0, 0] for x, _, _ in data.val.batches(16, shuffle=False)])
    shuffled = _first_values(data.val.batches(16, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert len(ordered) == len(data.val)
    assert torch.equal(torch.sort(shuffled).values, ordered) and not torch.equal(shuffled, ordered)
    again = _first_values(data.val.batches(16, shuffle=True, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(again, shuffled)


def test_prepare_client_too_short() -> None:
    expected = r"^short: needs at least \d+ rows for lookback 96 \+ horizon 48 \(has 200\)"
    with pytest.raises(DataError, match=expected):
        prepare_client(synthetic_table(2, 200, seed=0, name="short"), lookback=96, horizon=48)


def test_prepare_client_on_weather_site(sites: list[SeriesTable]) -> None:
    data = prepare_client(sites[0], lookback=96, horizon=48)
    x, t, y = next(data.train.batches(32, shuffle=True, generator=torch.Generator().manual_seed(1)))
    assert x.shape == (32, 96, sites[0].n_features) and y.shape == (32, 48, sites[0].n_features)
    assert data.latitude == sites[0].latitude and data.n_train == 7008 - 144 + 1


def test_rows_from_equals_indexing_with_a_grid() -> None:
    """The window gather of every training step gives what indexing with a (B, length) grid gives,
    contiguous, and an empty batch for no positions (a split too short for any window)."""
    from edge_agent.data.windows import rows_from

    values = torch.randn(50, 3)
    first = torch.tensor([0, 7, 7, 40])
    grid = values[first.unsqueeze(1) + torch.arange(10)]
    gathered = rows_from(values, first, 10)
    assert torch.equal(gathered, grid) and gathered.is_contiguous()
    assert rows_from(values[:4], torch.tensor([], dtype=torch.long), 10).shape == (0, 10, 3)
    with pytest.raises((IndexError, RuntimeError)):
        rows_from(values, torch.tensor([41]), 10)
