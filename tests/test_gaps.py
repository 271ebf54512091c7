"""Gaps in the data: step inference, gap detection, the fill policies value by value, and windows
that never cross a gap, on hand-made CSV files (line numbers count the header as line 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from pydantic import ValidationError

from edge_agent.config import DataSource
from edge_agent.data import (
    Cell,
    DataError,
    GapPolicy,
    SeriesTable,
    build_pool,
    client_tables,
    fill_gaps,
    load_csv,
    prepare_client,
)
from edge_agent.data.gaps import Gap

NAN = np.nan
HINT = "to skip or fill them, pass --fill skip|ffill|interpolate (in agent.toml: data.gaps.fill)"
SKIP, FFILL, INTERPOLATE = GapPolicy(fill="skip"), GapPolicy(fill="ffill"), GapPolicy(fill="interpolate")

# Hourly from 00:00 to 11:00. Missing: b at 01:00 (an empty cell), 02:00-03:00, 06:00-09:00.
# Column a misses 2 steps then 4; column b misses 3 steps (the empty cell joins the timestamp gap) then 4.
GAPPY = [
    "date,a,b",
    "2021-03-01 00:00,1,10",
    "2021-03-01 01:00,2,",
    "2021-03-01 04:00,8,40",
    "2021-03-01 05:00,9,50",
    "2021-03-01 10:00,19,100",
    "2021-03-01 11:00,20,110",
]


def _write(tmp_path: Path, rows: list[str], name: str = "gappy.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n")
    return path


def _hourly(stamps: pd.DatetimeIndex, values: np.ndarray) -> list[str]:
    """A file body with one column 'v' at the given timestamps."""
    return ["date,v"] + [f"{t:%Y-%m-%d %H:%M:%S},{v:.6g}" for t, v in zip(stamps, values)]


# ---------------------------------------------------------------- step and gap detection


@pytest.mark.parametrize(("step", "printed"), [("1h", "1:00:00"), ("30min", "0:30:00"), ("1D", "1 day, 0:00:00")])
def test_step_is_inferred(tmp_path: Path, step: str, printed: str) -> None:
    stamps = pd.date_range("2021-01-01", periods=20, freq=step)
    table = load_csv(_write(tmp_path, _hourly(stamps, np.arange(20.0))))
    assert table.gaps.step == pd.Timedelta(step)
    assert table.gaps.summary() == f"one row every {printed}, no gaps"
    assert table.index.equals(stamps) and table.present.all()


def test_step_is_the_most_common_interval_even_with_gaps(tmp_path: Path) -> None:
    stamps = pd.DatetimeIndex(["2021-01-01 00:00", "2021-01-01 00:30", "2021-01-01 02:00", "2021-01-01 02:30"])
    table = load_csv(_write(tmp_path, _hourly(stamps, np.arange(4.0))), gaps=SKIP)
    assert table.gaps.step == pd.Timedelta("30min") and table.n_rows == 6
    assert table.gaps.gaps == (Gap(pd.Timestamp("2021-01-01 01:00"), 2, 2),)


def test_no_dominant_step_is_refused(tmp_path: Path) -> None:
    stamps = pd.DatetimeIndex(["2021-01-01 00:00", "2021-01-01 01:00", "2021-01-01 03:00", "2021-01-01 06:00",
                               "2021-01-01 07:00", "2021-01-01 09:00", "2021-01-01 12:00"])
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, _hourly(stamps, np.arange(7.0)), "irregular.csv"), gaps=SKIP)
    assert str(caught.value) == (
        "irregular.csv: no regular sampling step: the most common interval between rows covers only 2 of 6; "
        "intervals seen: 1:00:00 (2 times), 2:00:00 (2 times), 3:00:00 (2 times); put the rows on one interval "
        "first (e.g. pandas: frame.resample('1h').mean())"
    )


def test_half_of_the_intervals_is_enough(tmp_path: Path) -> None:
    stamps = pd.DatetimeIndex(["2021-01-01 00:00", "2021-01-01 01:00", "2021-01-01 03:00"])
    table = load_csv(_write(tmp_path, _hourly(stamps, np.arange(3.0))), gaps=SKIP)
    assert table.gaps.step == pd.Timedelta("1h") and table.n_rows == 4


def test_timestamps_off_the_step_and_single_rows_are_refused(tmp_path: Path) -> None:
    stamps = pd.DatetimeIndex(["2021-01-01 00:00", "2021-01-01 01:00", "2021-01-01 02:30", "2021-01-01 03:00",
                               "2021-01-01 04:00"])
    expected = (
        "offgrid.csv: 1 timestamps are off the 1:00:00 step (the most common interval) from line 2 "
        "(2021-01-01 00:00:00): line 4 (2021-01-01 02:30:00) (header is line 1)"
    )
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, _hourly(stamps, np.arange(5.0)), "offgrid.csv"), gaps=FFILL)
    assert str(caught.value) == expected
    with pytest.raises(DataError, match=r"^one\.csv: only one data row; the sampling step needs at least two$"):
        load_csv(_write(tmp_path, ["date,v", "2021-01-01,1"], "one.csv"))


def test_missing_timestamps_are_refused_with_lines_and_lengths(tmp_path: Path) -> None:
    rows = [r.replace(",2,", ",2,20") for r in GAPPY]
    rows.insert(3, "")  # a blank line: file line numbers still count it
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, rows))
    assert str(caught.value) == (
        "gappy.csv: 2 gaps in the timestamps (6 missing steps of 1:00:00): "
        "2 steps (2:00:00) between line 3 (2021-03-01 01:00:00) and line 5 (2021-03-01 04:00:00), "
        "4 steps (4:00:00) between line 6 (2021-03-01 05:00:00) and line 7 (2021-03-01 10:00:00) "
        f"(header is line 1); {HINT}"
    )


def test_many_gaps_are_listed_first_five(tmp_path: Path) -> None:
    days = pd.date_range("2021-01-01", periods=38, freq="D")
    stamps = days[np.arange(38) % 4 < 2]  # two days on, two days off: 20 rows, 9 gaps of 2 days
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, _hourly(stamps, np.arange(20.0)), "daily.csv"))
    message = str(caught.value)
    assert message.startswith("daily.csv: 9 gaps in the timestamps (18 missing steps of 1 day, 0:00:00): ")
    assert message.count("between line") == 5
    assert "2 steps (2 days, 0:00:00) between line 11 (2021-01-18 00:00:00) and line 12 (2021-01-21 00:00:00)" in message
    assert f", ... (header is line 1); {HINT}" in message


# ---------------------------------------------------------------- fill policies, value by value


def _columns(tmp_path: Path, policy: GapPolicy) -> tuple[np.ndarray, np.ndarray]:
    table = load_csv(_write(tmp_path, GAPPY), gaps=policy)
    assert table.index.equals(pd.date_range("2021-03-01", periods=12, freq="h"))
    return table.values[:, 0], table.values[:, 1]


def test_skip_keeps_every_gap(tmp_path: Path) -> None:
    a, b = _columns(tmp_path, SKIP)
    np.testing.assert_array_equal(a, [1, 2, NAN, NAN, 8, 9, NAN, NAN, NAN, NAN, 19, 20])
    np.testing.assert_array_equal(b, [10, NAN, NAN, NAN, 40, 50, NAN, NAN, NAN, NAN, 100, 110])
    table = load_csv(_write(tmp_path, GAPPY), gaps=SKIP)
    assert table.present.tolist() == [True, False, False, False, True, True, False, False, False, False, True, True]
    assert table.gaps.summary() == (
        "one row every 1:00:00; 2 gaps (7 missing steps); kept 2 (7 steps), windows across them are dropped: "
        "3 steps (3:00:00) from 2021-03-01 01:00:00, 4 steps (4:00:00) from 2021-03-01 06:00:00"
    )


def test_ffill_fills_short_gaps_with_the_last_value(tmp_path: Path) -> None:
    a, b = _columns(tmp_path, FFILL)  # max_fill_steps 3: the 4-step gap stays
    np.testing.assert_array_equal(a, [1, 2, 2, 2, 8, 9, NAN, NAN, NAN, NAN, 19, 20])
    np.testing.assert_array_equal(b, [10, 10, 10, 10, 40, 50, NAN, NAN, NAN, NAN, 100, 110])
    report = load_csv(_write(tmp_path, GAPPY), gaps=FFILL).gaps
    assert report.gaps == (Gap(pd.Timestamp("2021-03-01 01:00"), 3, 0), Gap(pd.Timestamp("2021-03-01 06:00"), 4, 4))
    assert report.summary() == (
        "one row every 1:00:00; 2 gaps (7 missing steps); filled 1 (3 steps) by ffill, up to 3 steps per gap; "
        "kept 1 (4 steps), windows across them are dropped: 4 steps (4:00:00) from 2021-03-01 06:00:00"
    )


def test_interpolate_draws_a_line_between_the_values_around_a_gap(tmp_path: Path) -> None:
    a, b = _columns(tmp_path, INTERPOLATE)
    np.testing.assert_array_equal(a, [1, 2, 4, 6, 8, 9, NAN, NAN, NAN, NAN, 19, 20])  # 2 -> 8 in 3 steps
    np.testing.assert_array_equal(b, [10, 17.5, 25, 32.5, 40, 50, NAN, NAN, NAN, NAN, 100, 110])  # 10 -> 40 in 4
    a, b = _columns(tmp_path, GapPolicy(fill="interpolate", max_fill_steps=4))
    np.testing.assert_array_equal(a, [1, 2, 4, 6, 8, 9, 11, 13, 15, 17, 19, 20])
    np.testing.assert_array_equal(b, [10, 17.5, 25, 32.5, 40, 50, 60, 70, 80, 90, 100, 110])


def test_max_fill_steps_is_a_gap_length_limit_not_a_partial_fill(tmp_path: Path) -> None:
    a, b = _columns(tmp_path, GapPolicy(fill="ffill", max_fill_steps=2))
    np.testing.assert_array_equal(a, [1, 2, 2, 2, 8, 9, NAN, NAN, NAN, NAN, 19, 20])
    np.testing.assert_array_equal(b, [10, NAN, NAN, NAN, 40, 50, NAN, NAN, NAN, NAN, 100, 110])
    report = load_csv(_write(tmp_path, GAPPY), gaps=GapPolicy(fill="ffill", max_fill_steps=2)).gaps
    assert report.gaps[0] == Gap(pd.Timestamp("2021-03-01 01:00"), 3, 3)  # 'a' filled, 'b' not: the row stays
    assert "3 steps (3:00:00) from 2021-03-01 01:00:00, 4 steps" in report.summary()


def test_fill_gaps_on_plain_arrays_with_statuses() -> None:
    """The policy works on any regular series (live readings too): 1-D or 2-D, NaN for missing."""
    values = [NAN, 1.0, NAN, 3.0, NAN, NAN, NAN, 7.0, NAN]
    R, F, M = Cell.REAL, Cell.FILLED, Cell.MISSING
    filled, status = fill_gaps(values, GapPolicy(fill="interpolate", max_fill_steps=2))
    np.testing.assert_array_equal(filled, [NAN, 1, 2, 3, NAN, NAN, NAN, 7, NAN])
    assert status.tolist() == [M, R, F, R, M, M, M, R, M]  # nothing before the first value or after the last
    filled, status = fill_gaps(values, GapPolicy(fill="ffill", max_fill_steps=3))
    np.testing.assert_array_equal(filled, [NAN, 1, 1, 3, 3, 3, 3, 7, 7])  # the last value carries to the end
    assert status.tolist() == [M, R, F, R, F, F, F, R, F]
    for policy in (GapPolicy(fill="skip"), GapPolicy()):
        filled, status = fill_gaps(values, policy)
        np.testing.assert_array_equal(filled, values)
        assert status.tolist() == [M, R, M, R, M, M, M, R, M]
    both, status = fill_gaps(np.column_stack([values, values[::-1]]), FFILL)
    np.testing.assert_array_equal(both[:, 0], fill_gaps(values, FFILL)[0])
    np.testing.assert_array_equal(both[:, 1], fill_gaps(values[::-1], FFILL)[0])


def test_policy_is_strict_small_and_frozen() -> None:
    assert GapPolicy() == GapPolicy(fill="refuse", max_fill_steps=3)
    for bad in ({"fill": "mean"}, {"max_fill_steps": 0}, {"max_fill_steps": "3"}, {"limit": 3}):
        with pytest.raises(ValidationError):
            GapPolicy(**bad)
    with pytest.raises(ValidationError):
        FFILL.fill = "skip"


# ---------------------------------------------------------------- empty (NaN) cells


def test_empty_cells_are_refused_without_a_policy(tmp_path: Path) -> None:
    rows = ["date,a,b", "2021-01-01 00:00,1,", "2021-01-01 01:00,2,3", "2021-01-01 02:00,,4"]
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, rows, "nan.csv"))
    assert str(caught.value) == (
        "nan.csv: column 'a' has 1 NaN/inf values at lines 4; column 'b' has 1 NaN/inf values at lines 2 "
        f"(header is line 1); {HINT}"
    )


def test_empty_cells_are_filled_or_skipped_but_inf_is_always_refused(tmp_path: Path) -> None:
    rows = ["date,a,b", "2021-01-01 00:00,1,5", "2021-01-01 01:00,,6", "2021-01-01 02:00,3,"]
    path = _write(tmp_path, rows, "nan.csv")
    np.testing.assert_array_equal(load_csv(path, gaps=FFILL).values, [[1, 5], [1, 6], [3, 6]])
    np.testing.assert_array_equal(load_csv(path, gaps=INTERPOLATE).values, [[1, 5], [2, 6], [3, NAN]])
    skipped = load_csv(path, gaps=SKIP)
    assert skipped.observed.tolist() == [[True, True], [False, True], [True, False]]
    assert skipped.present.tolist() == [True, False, False]
    with pytest.raises(DataError) as caught:
        load_csv(_write(tmp_path, rows[:3] + ["2021-01-01 02:00,inf,7"], "inf.csv"), gaps=FFILL)
    assert str(caught.value) == "inf.csv: column 'a' has 1 inf values at lines 4 (header is line 1)"


# ---------------------------------------------------------------- gap-free files


def test_gap_free_files_load_as_before_under_every_policy(tmp_path: Path) -> None:
    stamps = pd.date_range("2016-07-01", periods=30, freq="h")
    path = _write(tmp_path, _hourly(stamps, np.arange(30) * 0.25 - 3.5), "clean.csv")
    before = load_csv(path)
    assert before.index.equals(stamps) and before.observed.all() and before.gaps.gaps == ()
    np.testing.assert_array_equal(before.values[:, 0], np.arange(30) * 0.25 - 3.5)
    for policy in (SKIP, FFILL, INTERPOLATE):
        table = load_csv(path, gaps=policy)
        assert table.index.equals(before.index) and table.index.freq == before.index.freq
        np.testing.assert_array_equal(table.values, before.values)
        assert table.present.all() and table.gaps.summary() == "one row every 1:00:00, no gaps"


# ---------------------------------------------------------------- windows never cross a gap


def _gappy_series(tmp_path: Path, policy: GapPolicy) -> tuple[SeriesTable, pd.DatetimeIndex]:
    """600 hourly steps of a two-column series with 7 holes (1 to 30 steps) and two empty cells."""
    stamps = pd.date_range("2021-01-01", periods=600, freq="h")
    holes = [(50, 1), (120, 3), (200, 30), (300, 2), (420, 6), (500, 4), (540, 1)]
    keep = np.ones(600, dtype=bool)
    for start, length in holes:
        keep[start : start + length] = False
    values = np.column_stack([np.sin(np.arange(600) / 7.0), np.arange(600) * 0.1])
    rows = ["date,s,t"] + [f"{t:%Y-%m-%d %H:%M:%S},{s:.6g},{u:.6g}" for t, (s, u) in zip(stamps[keep], values[keep])]
    rows[10] = rows[10].rsplit(",", 1)[0] + ","  # one empty cell in 't'
    rows[400] = rows[400].split(",")[0] + ",," + rows[400].rsplit(",", 1)[1]  # one in 's'
    table = load_csv(_write(tmp_path, rows, "holes.csv"), gaps=policy)
    return table, stamps


@pytest.mark.parametrize("policy", [SKIP, FFILL, GapPolicy(fill="interpolate", max_fill_steps=5)])
@pytest.mark.parametrize("stride", [1, 3])
def test_no_window_covers_a_missing_row(tmp_path: Path, policy: GapPolicy, stride: int) -> None:
    table, stamps = _gappy_series(tmp_path, policy)
    assert table.index.equals(stamps)
    lookback, horizon = 24, 12
    data = prepare_client(table, lookback, horizon, stride=stride)
    scaled = data.scaler.transform(table.values)
    offsets = {"train": 0, "val": 480 - lookback, "test": 540 - lookback}  # split_bounds(600, 24, 12)
    ends = {"train": 480, "val": 540, "test": 600}
    for split, offset in offsets.items():
        windows = getattr(data, split)
        step = stride if split == "train" else 1
        grid = range(0, ends[split] - offset - lookback - horizon + 1, step)
        complete = [s for s in grid if table.present[offset + s : offset + s + lookback + horizon].all()]
        assert windows.starts.tolist() == complete, split
        assert windows.dropped == len(grid) - len(complete), split
        x, _, y = windows.batch(torch.arange(len(windows)))
        assert torch.isfinite(x).all() and torch.isfinite(y).all()
        for row, start in enumerate(complete):
            np.testing.assert_array_equal(x[row].numpy(), scaled[offset + start : offset + start + lookback])
            np.testing.assert_array_equal(y[row].numpy(), scaled[offset + start + lookback : offset + start + 36])
    assert data.train.dropped > 0


def test_scaler_is_fitted_on_present_train_rows(tmp_path: Path) -> None:
    table, _ = _gappy_series(tmp_path, SKIP)
    data = prepare_client(table, 24, 12)
    train = table.values[:480][table.present[:480]].astype(np.float64)
    np.testing.assert_allclose(data.scaler.mean, train.mean(0), rtol=1e-6)
    np.testing.assert_allclose(data.scaler.std, train.std(0), rtol=1e-6)


def test_fill_leaves_fewer_windows_dropped(tmp_path: Path) -> None:
    dropped = [prepare_client(_gappy_series(tmp_path, p)[0], 24, 12).train.dropped for p in (SKIP, FFILL)]
    assert dropped[0] > dropped[1] > 0


def test_nothing_usable_left_is_refused(tmp_path: Path) -> None:
    table, _ = _gappy_series(tmp_path, SKIP)
    with pytest.raises(DataError) as caught:
        prepare_client(table, 48, 24)
    assert str(caught.value) == (
        "holes.csv: no val or test window of 48 + 24 steps without a gap (49 of 600 steps miss a value); "
        "fill short gaps (fill = 'ffill' or 'interpolate') or use a shorter lookback"
    )
    filled = _gappy_series(tmp_path, GapPolicy(fill="interpolate", max_fill_steps=6))[0]
    assert prepare_client(filled, 48, 24).test.dropped == 0


def test_masks_follow_columns_into_pools_and_clients(tmp_path: Path) -> None:
    table, _ = _gappy_series(tmp_path, SKIP)
    assert table.select(["t"]).observed[:, 0].tolist() == table.observed[:, 1].tolist()
    assert table.select(["t"]).gaps is None
    pool = build_pool([table])
    clients = client_tables(pool, [[1], [0, 1]])
    np.testing.assert_array_equal(clients[0].observed[:, 0], table.observed[:, 1])
    assert clients[1].present.tolist() == table.present.tolist()
    assert clients[0].present.sum() > clients[1].present.sum()  # the empty cell of 's' does not count for 't'


# ---------------------------------------------------------------- agent.toml [data]


def test_data_source_takes_the_policy(tmp_path: Path) -> None:
    path = _write(tmp_path, GAPPY)
    source = DataSource.model_validate({"csv": str(path), "gaps": {"fill": "interpolate", "max_fill_steps": 4}})
    assert source.gaps == GapPolicy(fill="interpolate", max_fill_steps=4)
    np.testing.assert_array_equal(source.load().values[:, 0], [1, 2, 4, 6, 8, 9, 11, 13, 15, 17, 19, 20])
    only_b = DataSource.model_validate({"csv": str(path), "columns": ["b"], "gaps": {"fill": "skip"}}).load()
    assert only_b.columns == ("b",) and only_b.present.sum() == 5
    with pytest.raises(DataError, match=r"^gappy\.csv: column 'b' has 1 NaN/inf values at lines 3"):
        DataSource.model_validate({"csv": str(path)}).load()
    with pytest.raises(ValidationError, match="gaps.fill"):
        DataSource.model_validate({"csv": str(path), "gaps": {"fill": "zero"}})
    with pytest.raises(ValidationError, match="gaps: applies to csv data"):
        DataSource.model_validate({"site": "miami", "gaps": {"fill": "skip"}})
