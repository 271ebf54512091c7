"""Anchors and scaled errors: MASE by hand, the anchors' forecasts against their definitions and
against statsforecast's own forward pass, and the choice among everything a gateway can serve."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.anchors import (ANCHORS, ETS, MSTL, ETSNoSeason, SeasonalNaive, Theta, WeeklyNaive, WindowAverage,
                                filled)
from edge_agent.data import SeriesTable, prepare_client
from edge_agent.scoring import Scale, seasonal_naive_mae
from edge_agent.choice import choose
from edge_agent.selection import anchor_forecasts, anchor_metrics, best_anchor
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
    with pytest.raises(ValueError, match=r"window_average: origins must lie in \[28, 40\]"):
        WindowAverage(period).fit(series[:3]).forecast(series, np.array([27]), 5)
    with pytest.raises(ValueError, match="ets needs 7 rows of history"):
        ETS(period).fit(series[:6])


def test_missing_values_are_carried_forward() -> None:
    data = np.array([[np.nan, 1.0], [2.0, np.nan], [np.nan, np.nan], [4.0, 5.0]])
    assert filled(data).tolist() == [[2.0, 1.0], [2.0, 1.0], [2.0, 1.0], [4.0, 5.0]]
    assert filled(np.full((3, 1), np.nan)).tolist() == [[0.0], [0.0], [0.0]]


def periodic(days: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(24 * days)
    return (10 + 4 * np.sin(2 * np.pi * t / 24) + np.sin(2 * np.pi * t / 168) + rng.normal(0, 0.3, len(t)))[:, None]


def weather(site: str, columns: tuple[str, ...], rows: int) -> np.ndarray:
    """The first ``rows`` hours of ``columns`` at a bundled pvlib weather site (float64, no gaps)."""
    from edge_agent.data.weather import load_site

    table = load_site(site)
    return filled(table.values[:rows, [table.columns.index(c) for c in columns]])


def test_the_two_ets_anchors_fit_a_season_and_none_and_validation_picks_between_them() -> None:
    """Two weeks of Amsterdam's hourly weather: ``ets`` fits an additive daily season to diffuse
    irradiance (dhi) and to pressure, ``ets_noseason`` none, each the very model statsforecast's
    AutoETS fits in that form. With 40 hours (under two days) ``ets`` fits no season either, and
    forecasts. Which a gateway serves is its validation windows' choice (``select``), not AICc."""
    from statsforecast.models import AutoETS

    history = weather("amsterdam", ("dhi", "pressure"), 24 * 14)
    for anchor, form in ((ETS(24), "ZZA"), (ETSNoSeason(24), "ZZN")):
        fitted = anchor.fit(history)
        assert all(model["components"][2] == form[2] for model in fitted.models)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            library = [AutoETS(season_length=24, model=form).fit(history[:, f]).model_ for f in range(2)]
        assert [m["aicc"] for m in fitted.models] == pytest.approx([m["aicc"] for m in library], rel=1e-12)
    short = ETS(24).fit(history[:40])
    assert ETS(24).form(40) == "ZZN" and all(model["components"][2] == "N" for model in short.models)
    assert np.isfinite(short.forecast(history, np.array([40, 100]), 24)).all()


def cross_validation(series: np.ndarray, model, cutoff: int, windows: int, h: int, step: int, **options) -> np.ndarray:
    """statsforecast's own ``StatsForecast.cross_validation`` of ``model`` on one column of ``series``
    (rows 0.. ``cutoff + (windows - 1) * step + h``): its forecasts (windows, h) from the cutoffs
    ``cutoff``, ``cutoff + step``, ... (the rows each window forecasts from)."""
    from statsforecast import StatsForecast

    end = cutoff + (windows - 1) * step + h
    frame = pd.DataFrame({"unique_id": "x", "ds": np.arange(end), "y": series[:end]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = StatsForecast([model], freq=1).cross_validation(
            df=frame, h=h, test_size=end - cutoff, step_size=step, **options)
    assert sorted(set(result["cutoff"] + 1)) == list(range(cutoff, cutoff + windows * step, step))
    return result[repr(model)].to_numpy().reshape(windows, h)


def test_ets_forecasts_equal_statsforecasts_cross_validation_with_fixed_parameters() -> None:
    """ETS fits its parameters on the last 56 days of the history and filters its state from there
    through every later row: statsforecast's ``cross_validation`` with ``refit=False`` (fitted on
    the first window's training rows, then ``forward`` over each window's rows) on the series from
    that row. A history of 60 days and 5 hours, so its filtering starts 4 days and 5 hours in,
    mid-day, where a state started at row 0 would be 5 hours out of phase. Each feature equals the
    library's AutoETS of the form it chose and differs from the other form's."""
    from statsforecast.models import AutoETS

    series = weather("amsterdam", ("dhi", "pressure"), 24 * 80)
    history = 24 * 60 + 5
    ets = ETS(24).fit(series[:history])
    start = history - 56 * 24
    assert ets.start == start
    windows, step, h = 12, 7, 24
    ours = ets.forecast(series, history + step * np.arange(windows), h)
    for f, model in enumerate(ets.models):
        library = {form: cross_validation(series[start:, f], AutoETS(24, form, alias=form), history - start,
                                          windows, h, step, refit=False) for form in ("ZZN", "ZZA")}
        noseason = ETSNoSeason(24).fit(series[:history]).forecast(series, history + step * np.arange(windows), h)
        assert noseason[:, :, f] == pytest.approx(library["ZZN"], rel=1e-9, abs=1e-9)
        chosen = "ZZA" if model["components"][2] == "A" else "ZZN"
        other = "ZZN" if chosen == "ZZA" else "ZZA"
        assert ours[:, :, f] == pytest.approx(library[chosen], rel=1e-9, abs=1e-9)
        assert np.abs(ours[:, :, f] - library[other]).max() > 1e-3


def test_theta_and_mstl_equal_statsforecasts_cross_validation_from_each_day() -> None:
    """Both forecast from each day's first row on the four weeks before it, the origin ``day + k``
    taking steps ``k .. k + 23`` of that day's 47-step path: ``cross_validation`` with a day's step,
    47 steps ahead and ``input_size`` = four weeks. Theta with the parameters it fitted on the last
    four weeks of its 30-day history (``refit=False``: fitted on the first window's rows, then
    ``forward``), MSTL refitted every day (``refit=True``). Amsterdam's air temperature."""
    from statsforecast.models import MSTL as SfMSTL
    from statsforecast.models import AutoTheta

    series = weather("amsterdam", ("temp_air",), 24 * 40)
    day, h = 24 * 30, 24
    origins = np.array([day, day + 5, day + 24 + 23])
    for ours, library, refit in ((Theta(24).fit(series[:day]), AutoTheta(season_length=24), False),
                                 (MSTL(24), SfMSTL(season_length=[24, 168]), True)):
        paths = cross_validation(series[:, 0], library, day, 2, 23 + h, 24, refit=refit, input_size=28 * 24)
        expected = np.stack([paths[0, :h], paths[0, 5:5 + h], paths[1, 23:23 + h]])
        assert ours.forecast(series, origins, h)[:, :, 0] == pytest.approx(expected, rel=1e-9, abs=1e-9), ours.name


def test_anchors_that_look_back_from_each_origin_forecast_past_a_short_training_split() -> None:
    """A client that kept 14 days of training history (of 60 days: 6 validate, 6 test). Every
    anchor that models the season beats MASE 1.5 on its test windows (``ets_noseason`` forecasts), MSTL included although it needs 15 days before an
    origin: it refits on the rows before each test day, which have 20 days or more. Its validation
    windows start at day 14, too early: none. A client that kept 3 days: ETS, which learns from
    the history, needs a day of it; weekly naive needs a week before each origin, which the
    validation windows (from day 3) lack and the test windows (from day 9) have."""
    client = prepare_client(hourly_table(periodic(60)[:, 0]), 48, 24, history=24 * 14)
    for name in ANCHORS:
        metrics = anchor_metrics(client, name, "test")
        assert metrics.mase < 1.5 if name != ETSNoSeason.name else np.isfinite(metrics.mase), name
        assert anchor_forecasts(client, name, "test").shape == (len(client.test), 24, 1)
    assert anchor_forecasts(client, "mstl", "val") is None
    short = prepare_client(hourly_table(periodic(60)[:, 0]), 48, 24, history=24 * 3)
    assert anchor_forecasts(short, "ets", "val") is not None
    assert anchor_forecasts(short, "seasonal_naive_week", "val") is None
    assert anchor_forecasts(short, "seasonal_naive_week", "test") is not None


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
