"""What a gateway serves: the median combination (by its definition, in torch and in ONNX
Runtime), per-window scores that average to the split's score, and a choice made on the latest
windows when the regime changes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.data import SeriesTable, prepare_client
from edge_agent.models import build_forecaster
from edge_agent.models.combination import MedianForecaster, median_forecast
from edge_agent.candidates import MEAN_OF_BEST
from edge_agent.choice import best, choose_at
from edge_agent.selection import (MEDIAN, anchor_batches, anchor_metrics, candidate_batches, fits_window,
                                  lookback_anchor, median_batches, recent_score, select, window_scores)
from edge_agent.train import evaluate, forecasts
from export.bundle import export_module
from tests.conftest import small_config


def hourly(values: np.ndarray) -> SeriesTable:
    index = pd.date_range("2023-01-01", periods=len(values), freq="h")
    return SeriesTable("site", index, values.reshape(len(values), -1), ("power",))


def regime_change(days: int = 300, seed: int = 4) -> np.ndarray:
    """A daily shape on a level that climbs by one a day (yesterday is the best guess), until the
    last two weeks of the validation split, from where the level jumps at random each day (the
    mean of the last week is the best guess)."""
    level = np.arange(days, dtype=float)
    switch = int(days * 0.9) - 14
    level[switch:] = level[switch] + np.random.default_rng(seed).normal(0, 6, days - switch)
    shape = 10 * np.sin(2 * np.pi * np.arange(24) / 24)
    return (level[:, None] + shape[None, :]).ravel()


def climbs_again(days: int = 200, back: int = 183, slope: float = 3.0) -> np.ndarray:
    """``regime_change``, whose level climbs again, by ``slope`` a day, from day ``back`` (in the
    test split): a gateway has a reason to re-choose during its test days."""
    values = regime_change(days).reshape(days, 24)
    values[back:] += (slope * np.arange(days - back))[:, None] + values[back - 1, 0] - values[back, 0]
    return values.ravel()


def test_the_median_is_numpys_for_odd_and_even_counts() -> None:
    for count in (3, 4, 7):
        stacked = torch.randn(count, 5, 6, 2, generator=torch.Generator().manual_seed(count))
        np.testing.assert_allclose(median_forecast(stacked).numpy(), np.median(stacked.numpy(), axis=0), rtol=1e-6)
    with pytest.raises(ValueError, match="at least two"):
        MedianForecaster([torch.nn.Identity()])


def test_per_window_scores_average_to_the_splits_score() -> None:
    client = prepare_client(hourly(regime_change()), 48, 24)
    for name in ("seasonal_naive", "window_average"):
        scores = window_scores(anchor_batches(client, name, "val"), None, client.val.scale)
        assert len(scores) == len(client.val) and scores.mean() == pytest.approx(anchor_metrics(client, name, "val").score)
    model = build_forecaster(small_config("dlinear", lookback=48, horizon=24), 1, 4, seed=1)
    scores = window_scores(forecasts(model, client.val), None, client.val.scale)
    assert scores.mean() == pytest.approx(evaluate(model, client.val).score, rel=1e-5)


def test_recent_scores_count_only_windows_whose_outcome_is_known() -> None:
    scores, origins = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 10, 20, 30])
    assert recent_score(scores, origins, 5, 26, None) == pytest.approx(2.0)  # windows 0-2 known at row 26
    assert recent_score(scores, origins, 5, 26, 10) == pytest.approx(np.average([1, 2, 3], weights=[2 ** -2.6, 2 ** -1.6, 2 ** -0.6]))
    assert recent_score(np.array([1.0, np.nan, 3.0, 4.0]), origins, 5, 26, None) == pytest.approx(2.0)  # unscored: left out
    assert math.isnan(recent_score(scores, origins, 5, 4, None))


def test_older_outcomes_count_less_and_still_count() -> None:
    """The choice weighs each known window by its age, halving every half-life: a candidate better
    over the last days wins with a short half-life, the long-run best with a long one."""
    origins = np.arange(0, 40 * 24, 24)
    steady = np.full(len(origins), 1.0)
    late = np.where(origins >= 33 * 24, 0.8, 1.2)  # better over its last week, worse before
    errors, at = {"steady": steady, "late": late}, 41 * 24
    assert choose_at(errors, origins, 24, at, 3 * 24) == ("late",)
    assert choose_at(errors, origins, 24, at, 30 * 24) == ("steady",)
    assert choose_at(errors, origins, 24, at, None) == ("steady",)
    assert choose_at(errors, origins, 24, at, 3 * 24, 2) == ("late",)  # steady is far behind: no near tie
    assert choose_at(errors, origins, 24, at, 3 * 24, 2, None) == ("late", "steady")
    weights = 0.5 ** ((at - origins) / (3 * 24))
    assert recent_score(late, origins, 24, at, 3 * 24) == pytest.approx(np.average(late, weights=weights))


def test_a_gateway_follows_the_regime_of_its_latest_windows() -> None:
    client = prepare_client(hourly(regime_change()), 48, 24)
    anchors = ("seasonal_naive", "window_average")
    assert select(client, {}, anchors).which == "seasonal_naive"  # over the whole validation month
    latest = select(client, {}, anchors, selection_days=7)
    assert latest.which == "window_average"
    assert latest.metrics(client, "test").mase < anchor_metrics(client, "seasonal_naive", "test").mase


def test_the_median_candidate_forecasts_the_median_of_its_members_and_exports_to_onnx(tmp_path) -> None:
    client = prepare_client(hourly(regime_change()), 48, 24)
    model = build_forecaster(small_config("dlinear", lookback=48, horizon=24), 1, 4, seed=1)
    anchors = ("seasonal_naive", "seasonal_naive_week", "window_average")  # a week back needs 168 steps: left out
    served = select(client, {"federated": model}, anchors, median=True)
    assert set(served.scores) == {"federated", *anchors, MEDIAN} and np.isfinite(served.scores[MEDIAN])
    members = [list(forecasts(model, client.test)), anchor_batches(client, "seasonal_naive", "test"),
               anchor_batches(client, "window_average", "test")]
    expected = np.median(np.stack([torch.cat([f for f, _ in m]).numpy() for m in members]), axis=0)
    got = median_batches([candidate_batches(client, n, m, "test") for n, m in
                          {"federated": model, "seasonal_naive": None, "window_average": None}.items()])
    np.testing.assert_allclose(got[0][0].numpy(), expected, rtol=1e-5, atol=1e-6)
    module = MedianForecaster([model, *(lookback_anchor(client, a) for a in anchors
                                        if fits_window(a, client.val, client.period))])
    assert [m.name for m in module.members[1:]] == ["seasonal_naive"]  # the lookback holds two days
    report = export_module(module, tmp_path, client)
    assert report.max_abs_error <= 1e-5


def test_simulate_re_chooses_each_day_exactly_as_the_agent_chooses_at_that_moment() -> None:
    """One rule, one cadence: the per-day choices behind ``simulate``'s served test scores equal
    what a live gateway's learner (``HeadLearner.serving_model``) chooses with its clock at the
    start of each of those days; with no clock it chooses at its present."""
    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.learners import HeadLearner
    from edge_agent.selection import present, served_days

    client = prepare_client(hourly(climbs_again()), 48, 24, stride=6)
    anchors = ("seasonal_naive", "window_average")
    fed = FederationConfig(rounds=1, keep_local=False, anchors=anchors, selection_days=3, min_steps=4)
    cfg = small_config("dlinear", lookback=48, horizon=24)
    result = run_federation([client], cfg, fed)
    batches, picks = served_days(client, result.served[0])
    assert batches[0][0].shape == client.test.targets().shape and len(set(picks)) == 3  # it does re-choose
    agent = HeadLearner(cfg, client, fed, fed.seed, 0, live=True)
    agent.model.load_state_dict(result.served[0].candidates["federated"].state_dict())
    origins = client.test.origins()
    for day in np.unique((origins - origins[0]) // client.period):
        at = int(origins[0] + day * client.period)
        assert (agent.serving_model(2, at=at).which,) == picks[int(np.flatnonzero((origins - origins[0]) // client.period == day)[0])]
    assert agent.serving_model(2).scores == agent.serving_model(2, at=present(client)).scores
    served = result.client_test[client.name].mase
    assert served == pytest.approx(forecast_metrics_of(batches, client), rel=1e-6)


def forecast_metrics_of(batches, client) -> float:
    from edge_agent.train import forecast_metrics

    return forecast_metrics(batches, None, None, client.test.scale).mase


def test_best_ranks_finite_scores_and_breaks_ties_by_the_order_listed() -> None:
    scores = {"federated": 0.9, "local": math.nan, "ets": 0.8, "theta": 0.8, "median": 0.85}
    assert best(scores) == ("ets",) and best(scores, 2) == ("ets", "theta")
    assert best(scores, 9, None) == ("ets", "theta", "median", "federated")
    assert best(scores, 9) == ("ets", "theta")  # the median is 6% behind: no near tie, it joins no mean
    assert best(scores, 9, 0.10) == ("ets", "theta", "median")
    assert best({"federated": math.nan, "local": math.inf}, 2) == ("federated",)
    with pytest.raises(ValueError, match="count"):
        best(scores, 0)


def test_combining_the_best_two_serves_their_mean_each_day_as_the_agent_does() -> None:
    """``combine`` = 2: each test day the served forecast is the mean of the two candidates with
    the lowest weighted score at the day's start where the second is within ``NEAR_BEST`` of the
    first, else the first alone; the same ones a live gateway's learner picks with its clock there,
    and it reports each as its share of what it serves."""
    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.candidates import quality, served_name
    from edge_agent.learners import HeadLearner
    from edge_agent.selection import served_days

    client = prepare_client(hourly(climbs_again()), 48, 24, stride=6)
    anchors = ("seasonal_naive", "window_average")
    fed = FederationConfig(rounds=1, keep_local=False, anchors=anchors, selection_days=3, min_steps=4, combine=2)
    cfg = small_config("dlinear", lookback=48, horizon=24)
    served = run_federation([client], cfg, fed).served[0]
    batches, picks = served_days(client, served)
    assert served.picks == picks[0] and {len(pick) for pick in picks} == {1, 2} and len(set(picks)) > 2
    each = {name: torch.cat([f for f, _ in candidate_batches(client, name, served.candidates.get(name), "test")])
            for name in served.candidates}
    expected = torch.stack([torch.stack([each[name][j] for name in pick]).mean(dim=0) for j, pick in enumerate(picks)])
    torch.testing.assert_close(batches[0][0], expected)
    agent = HeadLearner(cfg, client, fed, fed.seed, 0, live=True)
    agent.model.load_state_dict(served.candidates["federated"].state_dict())
    origins = client.test.origins()
    for day in np.unique((origins - origins[0]) // client.period):
        at = int(origins[0] + day * client.period)
        assert agent.serving_model(2, at=at).picks == picks[int(np.flatnonzero((origins - origins[0]) // client.period == day)[0])]
    metrics = agent.serving_metrics(2)
    chosen = agent.serving_model(2).picks
    assert {k: v for k, v in metrics.items() if k.startswith("serving.")} == {f"serving.{n}": 1 / len(chosen)
                                                                             for n in chosen}
    assert served_name(metrics) == " + ".join(chosen)
    assert quality(metrics)["served"] == pytest.approx(np.mean([metrics[f"val.{n}"] for n in chosen]))


def test_the_mean_of_the_best_two_exports_to_one_onnx_graph(tmp_path) -> None:
    """A gateway serving the mean of a model and a lookback anchor (or the median) ships it as one
    graph that ONNX Runtime runs as torch does (``export.bundle.combined_module``)."""
    from export.bundle import _exportable, combined_module

    client = prepare_client(hourly(regime_change()), 168, 24)
    model = build_forecaster(small_config("dlinear", lookback=168, horizon=24), 1, 4, seed=1)
    served = select(client, {"federated": model}, ("seasonal_naive", "seasonal_naive_week", "window_average"),
                    median=True, combine=2)
    served = dataclasses.replace(served, which=MEAN_OF_BEST, picks=best(served.scores, 2, None))  # no near tie here
    assert len(served.picks) == 2 and _exportable(served, client)
    module = combined_module(served, client)
    expected = torch.stack([torch.cat([f for f, _ in candidate_batches(client, name, served.candidates.get(name), "val")])
                            if name != MEDIAN else median_batches([candidate_batches(client, n, m, "val") for n, m in
                                                                  served.candidates.items()])[0][0]
                            for name in served.picks]).mean(dim=0)
    x, marks = client.val.batch(torch.arange(len(client.val)))[:2]
    torch.testing.assert_close(module(x, marks), expected, rtol=1e-5, atol=1e-5)
    assert export_module(module, tmp_path, client).max_abs_error <= 1e-5
