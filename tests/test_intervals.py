"""Seasons are properties of time: the model's lookback, horizon and season are a week, a day and a
day of the data's own sampling interval, the anchors count the same day, and a config whose steps
mean other spans than the data's is refused or flagged in one line, never run as a silent
12-hour season."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edge_agent.config import AgentConfig
from edge_agent.data import DataError, load_csv, load_site, prepare_client
from edge_agent.learners import make_learner
from edge_agent.models import ModelConfig
from tests.test_cli import edgefl

DAYS = 40


def half_hourly_csv(path: Path) -> Path:
    """Amsterdam's real hourly weather (pvlib's EPW file) put on a 30-minute grid: each half hour
    between two readings is their mean (the shape of the data matters less here than its interval)."""
    site = load_site("amsterdam").select(["temp_air", "relative_humidity"])
    hourly = pd.DataFrame(site.values[: DAYS * 24], index=site.index[: DAYS * 24], columns=list(site.columns))
    half = hourly.reindex(pd.date_range(hourly.index[0], hourly.index[-1], freq="30min")).interpolate()
    half.rename_axis("time").to_csv(path)
    return path


def test_the_recipe_spans_are_counted_in_steps_of_the_interval() -> None:
    assert (ModelConfig().lookback, ModelConfig().horizon, ModelConfig().season) == (168, 24, 24)
    quarter = ModelConfig(interval="15min")
    assert (quarter.lookback, quarter.horizon, quarter.season) == (672, 96, 96)
    assert ModelConfig(interval="30min", lookback=100).lookback == 100  # a step count set is kept
    assert ModelConfig(interval="30min").at_interval("1h").lookback == 168
    assert ModelConfig(interval="30min", horizon=12).at_interval("1h", keep={"horizon"}).horizon == 12
    with pytest.raises(ValueError, match="interval: 'fortnightly' is not a duration"):
        ModelConfig(interval="fortnightly")
    note = ModelConfig(interval="30min", season=24).step_notes()
    assert note == ["season = 24 steps is 12:00:00 at a 30min interval, not a day (48 steps) or a week: "
                    "set [model] season (--season) or leave it unset"]


def test_a_half_hourly_csv_runs_on_a_48_step_day_end_to_end(tmp_path: Path) -> None:
    csv, out = half_hourly_csv(tmp_path / "halfhourly.csv"), tmp_path / "run.json"
    proc = edgefl("simulate", "--data", str(csv), "--clients", "2", "--f-max", "2", "--rounds", "1",
                  "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "rows every 30min: lookback 336 steps (7d), horizon 48 (1d), season 48 (1d)" in proc.stdout
    model = json.loads(out.read_text())["config"]["model"]
    assert (model["interval"], model["lookback"], model["horizon"], model["season"]) == ("30min", 336, 48, 48)
    client = prepare_client(load_csv(csv), model["lookback"], model["horizon"])
    assert client.period == model["season"] == 48  # the anchors' day and MASE's season are the model's


def test_steps_that_do_not_fit_the_data_get_one_line_naming_the_interval_and_the_setting(tmp_path: Path) -> None:
    csv = half_hourly_csv(tmp_path / "halfhourly.csv")
    proc = edgefl("simulate", "--data", str(csv), "--clients", "2", "--rounds", "1", "--interval", "1h")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'error: halfhourly.csv: rows come every 30min but the model\'s interval is 1h: set [model] interval = '
        '"30min" (or --interval; the fleet\'s coordinator and every gateway use one)']
    cfg = AgentConfig(fleet="farm", client_id="gw", state_dir=tmp_path / "state", data={"csv": str(csv)})
    with pytest.raises(DataError, match='set \\[model\\] interval = "30min"'):
        make_learner(cfg, cfg.data.load())


def test_a_csv_without_a_regular_interval_names_the_intervals_and_how_to_fix_it(tmp_path: Path) -> None:
    stamps = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.cumsum([0, 10, 20, 30, 10, 20, 30, 40]), unit="min")
    pd.DataFrame({"time": stamps, "power": np.arange(8.0)}).to_csv(tmp_path / "meter.csv", index=False)
    with pytest.raises(DataError, match=r"no regular sampling step.*frame\.resample\('10min'\)\.mean\(\)"):
        load_csv(tmp_path / "meter.csv")
