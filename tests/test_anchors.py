"""Anchors and scaled errors: MASE by hand, the anchors' forecasts against their definitions and
against statsforecast's own forward pass, and the choice among everything a gateway can serve."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.anchors import ANCHORS, ETS, MSTL, SeasonalNaive, Theta, WeeklyNaive, WindowAverage, filled
from edge_agent.data import SeriesTable, prepare_client
from edge_agent.scoring import Scale, seasonal_naive_mae
from edge_agent.selection import anchor_forecasts, anchor_metrics, best_anchor, choose
from edge_agent.train import forecast_metrics


def hourly_table(values: np.ndarray, name: str = "site") -> SeriesTable:
    index = pd.date_range("2024-01-01", periods=len(values), freq="h")
    return SeriesTable(name, index, values.reshape(len(values), -1), tuple(f"x{i}" for i in range(values.reshape(len(values), -1).shape[1])))


def test_mase_of_a_hand_made_series_matches_the_definition_and_utilsforecast() -> None:
    """Training series 1,3,2,4,3,5 with season 2: in-sample seasonal naive errors |2-1|,|4-3|,|3-2|,
    |5-4| = 1 each, so the scale is 1; forecasts 4,6 against actuals 5,5 give |e| = 1,1: MASE 1.
    A second feature, 10,30,20,60,30,90: errors 10,30,10,30, scale 20; forecasts 45,50 against
    50,40: |e| = 5,10, MASE 7.5 / 20 = 0.375. The series' MASE is the mean over features: 0.6875."""
    train = np.array([[1.0, 10.0], [3.0, 30.0], [2.0, 20.0], [4.0, 60.0], [3.0, 30.0], [5.0, 90.0]])
    assert seasonal_naive_mae(train, 2).tolist() == [1.0, 20.0]
    forecast = np.array([[4.0, 45.0], [6.0, 50.0]])
    actual = np.array([[5.0, 50.0], [5.0, 40.0]])
    by_hand = (1.0 + 0.375) / 2
    model_std = np.array([2.0, 5.0])  # a model's own normalization: errors arrive divided by it
    scale = Scale.of(model_std, train, period=2)
    normalized = torch.as_tensor((forecast - actual) / model_std, dtype=torch.float32)
    ours = forecast_metrics([(normalized[None], torch.zeros(1, 2, 2))], None, None, scale).mase
    assert ours == pytest.approx(by_hand, rel=1e-6)
    from utilsforecast.losses import mase as utils_mase

    rows = []
    for f in range(2):
        rows += [{"unique_id": f"x{f}", "ds": t, "y": actual[t, f], "model": forecast[t, f]} for t in range(2)]
    train_rows = [{"unique_id": f"x{f}", "ds": t, "y": train[t, f]} for f in range(2) for t in range(6)]
    library = utils_mase(pd.DataFrame(rows), ["model"], seasonality=2, train_df=pd.DataFrame(train_rows))
    assert library["model"].mean() == pytest.approx(by_hand, rel=1e-9)


def test_scores_do_not_move_with_the_history_a_model_was_scaled_on() -> None:
    """Seasonal naive scored on test windows gives the same MSE, MAE and MASE whatever history the
    client kept, although each history fits another scaler."""
    rng = np.random.default_rng(0)
    t = np.arange(24 * 120)
    values = 5 + 3 * np.sin(2 * np.pi * t / 24) + 0.01 * t + rng.normal(0, 0.5, len(t))
    table = hourly_table(values)
    scores = []
    for history in (None, 24 * 30, 24 * 14):
        client = prepare_client(table, 48, 24, history=history)
        assert client.scaler.std[0] == pytest.approx(np.std(client.history)) if history else True
        scores.append(anchor_metrics(client, "seasonal_naive", "test"))
    assert all(s.mse == pytest.approx(scores[0].mse, rel=1e-5) for s in scores)
    assert all(s.mase == pytest.approx(scores[0].mase, rel=1e-5) for s in scores)


def test_seasonal_rules_by_their_definition() -> None:
    period, series = 4, np.arange(40, dtype=float)[:, None] ** 1.5
    origins = np.array([28, 31, 40])
    naive = SeasonalNaive(period).fit(series[:28]).forecast(series, origins, 6)
    assert naive[0, :, 0].tolist() == [series[24 + h % 4, 0] for h in range(6)]
    week = WeeklyNaive(period).fit(series[:28]).forecast(series, origins, 3)
    assert week[1, :, 0].tolist() == [series[31 - 28 + h, 0] for h in range(3)]
    average = WindowAverage(period).fit(series[:28]).forecast(series, origins, 5)
    expected = [np.mean([series[40 - 4 * k + h % 4, 0] for k in range(1, 8)]) for h in range(5)]
    assert average[2, :, 0] == pytest.approx(expected)
    with pytest.raises(ValueError, match="window_average needs 28 rows"):
        WindowAverage(period).fit(series[:27])


def test_missing_values_are_carried_forward() -> None:
    data = np.array([[np.nan, 1.0], [2.0, np.nan], [np.nan, np.nan], [4.0, 5.0]])
    assert filled(data).tolist() == [[2.0, 1.0], [2.0, 1.0], [2.0, 1.0], [4.0, 5.0]]
    assert filled(np.full((3, 1), np.nan)).tolist() == [[0.0], [0.0], [0.0]]


def periodic(days: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(24 * days)
    return (10 + 4 * np.sin(2 * np.pi * t / 24) + np.sin(2 * np.pi * t / 168) + rng.normal(0, 0.3, len(t)))[:, None]


def test_statsforecast_anchors_equal_the_librarys_own_forward_pass() -> None:
    """ETS filters its state over every row before each origin (one pass, then a forecast per
    origin): identical to statsforecast's forward on the series up to that origin. Theta and MSTL
    are statsforecast's forward on the four weeks before the first row of the origin's season."""
    from statsforecast.models import MSTL as SfMSTL
    from statsforecast.models import AutoETS, AutoTheta

    series = periodic(40)
    origins = np.array([24 * 20, 24 * 20 + 5, 24 * 33 + 23])
    ets = ETS(24).fit(series[: 24 * 20])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = AutoETS(season_length=24).fit(series[: 24 * 20, 0])
        expected = [reference.forward(series[:o, 0], h=12)["mean"] for o in origins]
    assert ets.forecast(series, origins, 12)[:, :, 0] == pytest.approx(np.stack(expected), abs=1e-9)
    theta = Theta(24).fit(series[: 24 * 20])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = AutoTheta(season_length=24).fit(series[: 24 * 20, 0])
        days = origins - origins % 24
        expected = [fitted.forward(series[max(0, d - 28 * 24):d, 0], h=23 + 12)["mean"][o - d: o - d + 12]
                    for o, d in zip(origins, days)]
    assert theta.forecast(series, origins, 12)[:, :, 0] == pytest.approx(np.stack(expected), abs=1e-9)
    mstl = MSTL(24).fit(series[: 24 * 20])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = SfMSTL(season_length=[24, 168]).fit(series[: 24 * 20, 0])
        day = origins[1] - origins[1] % 24
        path = fitted.forward(series[max(0, day - 28 * 24):day, 0], h=23 + 12)["mean"]
    assert mstl.forecast(series, origins[1:2], 12)[0, :, 0] == pytest.approx(path[5:17], abs=1e-9)


def test_every_anchor_beats_nothing_on_a_seasonal_series_and_short_histories_are_skipped() -> None:
    client = prepare_client(hourly_table(periodic(60)[:, 0]), 48, 24, history=24 * 14)
    for name in ANCHORS:
        metrics = anchor_metrics(client, name, "test")
        if name == "mstl":  # needs 15 days of history, the client kept 14
            assert metrics is None and anchor_forecasts(client, name, "val") is None
            continue
        assert metrics.mase < 1.5, name
        assert anchor_forecasts(client, name, "test").shape == (len(client.test), 24, 1)


def test_the_gateway_serves_the_candidate_that_validates_best() -> None:
    assert choose({"federated": 0.9, "local": math.nan, "ets": 0.8, "theta": 0.8}) == "ets"
    assert choose({"federated": math.nan, "local": math.inf}) == "federated"
    client = prepare_client(hourly_table(np.tile(np.arange(24.0), 50)), 48, 24)  # one day repeated exactly
    served = best_anchor(client, ("window_average", "seasonal_naive"))
    assert served.which == "window_average" and served.scores["seasonal_naive"] == pytest.approx(0.0, abs=1e-6)
    assert served.metrics(client, "test").mase == pytest.approx(0.0, abs=1e-6)


def short_csv(path, rows: int) -> None:
    index = pd.date_range("2024-03-01", periods=rows, freq="h")
    values = 10 + 5 * np.sin(2 * np.pi * np.arange(rows) / 24)
    pd.DataFrame({"date": index.strftime("%Y-%m-%d %H:%M:%S"), "power": values}).to_csv(path, index=False)


@pytest.mark.parametrize("rows", [10, 24 * 9])
def test_a_gateway_with_too_little_history_serves_the_best_anchor_it_can_fit_and_says_so(tmp_path, rows) -> None:
    """Less than one season: seasonal naive over the hours it has (the last value where an hour was
    never seen), named as such; nine days: the anchor that forecast its own last day best."""
    from edge_agent.config import AgentConfig
    from edge_agent.forecast import forecast
    from edge_agent.toml_config import dump_toml, load_config

    short_csv(tmp_path / "meter.csv", rows)
    config = tmp_path / "agent.toml"
    config.write_text(dump_toml({"fleet": "f", "client_id": "meter", "state_dir": str(tmp_path / "state"),
                                 "data": {"csv": str(tmp_path / "meter.csv")}}))
    result = forecast(load_config(config, AgentConfig))
    assert result.values.shape == (24, 1) and np.isfinite(result.values.numpy()).all()
    assert "local training needs" in result.served_by and result.model in ANCHORS
    if rows < 24:
        assert result.model == "seasonal_naive" and "less than one season" in result.served_by
        series = 10 + 5 * np.sin(2 * np.pi * np.arange(rows) / 24)
        expected = [series[h - 24 + rows] if h - 24 + rows >= 0 and h < 24 else series[-1] for h in range(24)]
        assert result.values[:, 0].numpy() == pytest.approx(np.array(expected, dtype=np.float32), rel=1e-5)
        assert len(set(np.round(result.values[:, 0].numpy(), 4))) > 1  # not a silent constant
    else:
        assert "chosen on the last season of its history" in result.served_by
