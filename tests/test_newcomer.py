"""A lookback filled by season from a history shorter than it (edge_agent.newcomer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from coordinator.broker_setup import free_port
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig, load_config
from edge_agent.forecast import fleet_model, forecast
from edge_agent.learners import fleet_template
from edge_agent.live import gateway_table
from edge_agent.candidates import MEAN_OF_BEST, MEDIAN
from edge_agent.newcomer import FLEET, Newcomer, seasonal_fill, with_median
from edge_agent.state import AgentState
from edge_agent.toml_config import dump_toml
from edge_agent.transport import MemoryTransport
from tests.test_hostile import round_message


def test_a_whole_season_fills_the_lookback_with_what_a_periodic_series_held_before() -> None:
    period, lookback = 24, 168
    series = np.sin(np.arange(400) * 2 * np.pi / period)[:, None]
    held = series[-30:]  # a day and six hours
    np.testing.assert_allclose(seasonal_fill(held, lookback, period), series[-lookback:], atol=1e-12)


def test_the_rows_held_are_kept_and_earlier_positions_repeat_the_earliest_row_of_their_phase() -> None:
    rows = np.arange(30, dtype=float).reshape(10, 3)
    out = seasonal_fill(rows, 14, 4)
    np.testing.assert_array_equal(out[-10:], rows)
    # positions -4..-1 before the first row take rows 0..3 (phase), none of the held rows change
    np.testing.assert_array_equal(out[:4], rows[[0, 1, 2, 3]])
    assert seasonal_fill(rows, 6, 4).shape == (6, 3)
    np.testing.assert_array_equal(seasonal_fill(rows, 6, 4), rows[-6:])


def test_less_than_a_season_takes_the_first_row_for_phases_not_seen_and_missing_values_carry_forward() -> None:
    rows = np.array([[1.0], [np.nan], [3.0]])
    out = seasonal_fill(rows, 8, 4)
    np.testing.assert_array_equal(out[-3:, 0], [1.0, 1.0, 3.0])
    assert np.isfinite(out).all()
    with pytest.raises(ValueError, match="no rows"):
        seasonal_fill(np.zeros((0, 2)), 8, 4)


def hourly_csv(path: Path, rows: int) -> None:
    index = pd.date_range("2024-03-01", periods=rows, freq="h")
    values = 10 + 5 * np.sin(2 * np.pi * np.arange(rows) / 24) + np.arange(rows) % 5
    pd.DataFrame({"date": index.strftime("%Y-%m-%d %H:%M:%S"), "power": values}).to_csv(path, index=False)


def head_config(tmp_path: Path, data: dict) -> AgentConfig:
    path = tmp_path / "agent.toml"
    sensors = {"step": "1h", "broker": {"port": free_port()},
               "features": [{"name": "power", "topic": "meter", "path": "power"}]}
    path.write_text(dump_toml({"fleet": "test", "client_id": "meter", "state_dir": str(tmp_path / "state"),
                               "data": data, "broker": {"port": free_port()},
                               **({"sensors": sensors} if data.get("source") == "sensors" else {})}))
    return load_config(path, AgentConfig)


def test_an_agent_that_cannot_train_yet_keeps_the_fleets_model_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """A live gateway without the rows training needs has no learner; a round's global model is
    still checked (signature, layout, finite, norm) and, when good, kept for what it serves."""
    cfg = head_config(tmp_path, {"source": "sensors"})
    agent = Agent(cfg, transport=MemoryTransport())
    assert agent.facts is None
    template = fleet_template(cfg, cfg.seed)
    good = {k: v + 0.01 for k, v in template.initial.items()}
    bad = [({k: torch.full_like(v, float("nan")) for k, v in good.items()}, template.signature),
           ({k: torch.full_like(v, 1e30) for k, v in good.items()}, template.signature),
           (good, "ab" * 16)]
    for number, (state, signature) in enumerate(bad, 1):
        agent.receive(round_message(number, state, signature))
        assert AgentState(cfg.state_dir).fleet_state() is None
    agent.receive(round_message(4, good, template.signature))
    kept = AgentState(cfg.state_dir).fleet_state()
    assert set(kept) == set(good) and all(torch.equal(kept[k], good[k]) for k in good)


@pytest.mark.parametrize("rows", [24 + 5, 24 * 6])
def test_a_gateway_too_short_to_train_serves_the_fleets_model_or_an_anchor_by_the_one_rule(tmp_path, rows) -> None:
    """With a day of its own rows and the fleet's model kept, the gateway serves the fleet's model
    (no outcome of its own known yet) on a lookback filled by season; with six days, whichever of
    the fleet's model and the anchors scored best on its own recent windows, saying so."""
    hourly_csv(tmp_path / "meter.csv", rows)
    cfg = head_config(tmp_path, {"csv": str(tmp_path / "meter.csv")})
    state = {k: v + 0.01 for k, v in fleet_template(cfg, cfg.seed).initial.items()}
    AgentState(cfg.state_dir).save_global(state)
    result = forecast(cfg)
    table = gateway_table(cfg)
    assert result.values.shape == (24, 1) and np.isfinite(result.values.numpy()).all()
    if rows < 48:
        assert result.model == FLEET and "no outcome of its own is known" in result.served_by
        model = fleet_model(cfg, table)
        site = Newcomer(table.values, table.index[0], table.index[1] - table.index[0], 24, cfg.model.lookback, 24)
        np.testing.assert_allclose(result.values.numpy(), site.model_forecasts(model, 1)[-1], rtol=1e-5)
    else:
        assert "on its own days (MASE: federated" in result.served_by
        assert result.model in (FLEET, MEDIAN, MEAN_OF_BEST, *cfg.training.anchors)
    (tmp_path / "state" / "global.safetensors").unlink()
    assert forecast(cfg).model != FLEET  # without the fleet's model: the best anchor it can fit


def test_the_median_of_a_newcomers_candidates_is_taken_over_those_that_forecast_each_window() -> None:
    """Per window, the median over the members with a forecast (the mean of the two middle ones
    for an even count), none where fewer than three forecast it, none at all with fewer than three
    candidates or without ``median``."""
    nan = np.nan
    members = {"a": np.array([1.0, 1.0, 1.0]), "b": np.array([2.0, 2.0, nan]), "c": np.array([9.0, nan, 5.0]),
               "d": np.array([4.0, 3.0, nan])}
    forecasts = {name: values.reshape(3, 1, 1) for name, values in members.items()}
    combined = with_median(forecasts)[MEDIAN].ravel()
    np.testing.assert_array_equal(combined[:2], [3.0, 2.0])
    assert np.isnan(combined[2])
    assert MEDIAN not in with_median(forecasts, median=False)
    assert MEDIAN not in with_median({"a": forecasts["a"], "b": forecasts["b"]})
