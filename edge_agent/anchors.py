"""Anchors: the forecasts a gateway can make alone, with nothing to train and no fleet to join.

Seasonal naive a day and a week back, the seasonal window average (the mean of the same hour over
the last seven days) and statsforecast's ETS, Theta and MSTL (Nixtla; not hand-written), each
fitted only on the history the gateway has. Every learned forecast is scored beside them on the
same windows and scale, and a gateway serves an anchor wherever that validates better than its
learned models (``edge_agent.selection``). One anchor is one small class registered in ``ANCHORS``.

Every anchor forecasts many origins of one series at once: ``forecast(series, origins, horizon)``
returns, for each origin row ``o``, the ``horizon`` rows from ``o`` on, using only
``series[:o]``. ``series`` starts at the first row of the gateway's history (the rows ``fit`` saw
come first); missing values are carried forward from the last observed one.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from edge_agent.recipe import ANCHORS as RECIPE_ANCHORS

SEASONS_PER_WEEK = 7


class Anchor(ABC):
    """One simple forecaster of ``period`` rows per season (a day of hourly data: 24)."""

    name: ClassVar[str]
    seasons_needed: ClassVar[int] = 1  # whole seasons of history before it can forecast

    def __init__(self, period: int) -> None:
        if period < 1:
            raise ValueError(f"{self.name}: period must be >= 1 row, got {period}")
        self.period = period

    @property
    def min_history(self) -> int:
        """Rows of history this anchor needs to be fitted and to forecast."""
        return self.seasons_needed * self.period

    def fit(self, history: np.ndarray) -> Anchor:
        """Learn whatever the anchor learns from ``history`` (rows x features, data units)."""
        if len(history) < self.min_history:
            raise ValueError(f"{self.name} needs {self.min_history} rows of history, has {len(history)}")
        self._fit(filled(history))
        return self

    def _fit(self, history: np.ndarray) -> None:
        """Nothing to fit by default (the seasonal rules)."""

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        """Forecasts (N, horizon, F) from every origin row in ``origins`` of ``series`` (rows x F)."""
        origins = np.asarray(origins, dtype=np.int64)
        if origins.size and (origins.min() < self.min_history or origins.max() > len(series)):
            raise ValueError(f"{self.name}: origins must lie in [{self.min_history}, {len(series)}]")
        return self._forecast(filled(series), origins, horizon)

    @abstractmethod
    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        """``forecast`` on a series without missing values."""


def filled(values: np.ndarray) -> np.ndarray:
    """``values`` (rows x F) as float64 with every NaN replaced by the last observed value of its
    column (the first observed one before any was seen; 0 for a column with none)."""
    data = np.array(values, dtype=np.float64)
    for column in data.T:
        missing = np.isnan(column)
        if not missing.any():
            continue
        if missing.all():
            column[:] = 0.0
            continue
        last = np.where(~missing, np.arange(len(column)), 0)
        np.maximum.accumulate(last, out=last)
        first = np.flatnonzero(~missing)[0]
        column[:] = column[last]
        column[:first] = column[first]
    return data


def seasonal_rows(origins: np.ndarray, horizon: int, period: int, seasons_back: int) -> np.ndarray:
    """Row indices (N, horizon): for each origin and step, the row ``seasons_back`` seasons before
    the step's own phase in the last season before the origin (the step repeats it)."""
    steps = np.arange(horizon) % period
    return origins[:, None] - seasons_back * period + steps[None, :]


class SeasonalNaive(Anchor):
    """Repeat the last season: tomorrow as today (statsforecast's SeasonalNaive)."""

    name: ClassVar[str] = "seasonal_naive"

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        return series[seasonal_rows(origins, horizon, self.period, 1)]


class WeeklyNaive(Anchor):
    """Repeat the same hours of last week (seasonal naive with a week as the season)."""

    name: ClassVar[str] = "seasonal_naive_week"
    seasons_needed: ClassVar[int] = SEASONS_PER_WEEK

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        week = self.period * SEASONS_PER_WEEK
        return series[seasonal_rows(origins, horizon, week, 1)]


class WindowAverage(Anchor):
    """The mean of the same step over the last seven seasons (statsforecast's
    SeasonalWindowAverage with window_size 7: for hourly data, the per-hour mean of the last week)."""

    name: ClassVar[str] = "window_average"
    seasons_needed: ClassVar[int] = SEASONS_PER_WEEK

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        rows = [seasonal_rows(origins, horizon, self.period, back) for back in range(1, self.seasons_needed + 1)]
        return np.mean([series[r] for r in rows], axis=0)


class StatsforecastAnchor(Anchor):
    """A statsforecast model per feature, fitted on at most the last ``FIT_SEASONS`` seasons of the
    history (the fit costs time in proportion to its rows, the forecasts barely change: README)."""

    FIT_SEASONS: ClassVar[int] = 56

    def __init__(self, period: int) -> None:
        super().__init__(period)
        self.models: list[Any] = []

    @abstractmethod
    def _model(self) -> Any:
        """A fresh, unfitted statsforecast model."""

    def _fit(self, history: np.ndarray) -> None:
        recent = history[-self.FIT_SEASONS * self.period:]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.models = [self._model().fit(recent[:, f]) for f in range(history.shape[1])]

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if len(self.models) != series.shape[1]:
            raise ValueError(f"{self.name}: fitted on {len(self.models)} features, asked for {series.shape[1]}")
        out = np.empty((len(origins), horizon, series.shape[1]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for f, model in enumerate(self.models):
                out[:, :, f] = self._series_forecasts(model, series[:, f], origins, horizon)
        return out

    @abstractmethod
    def _series_forecasts(self, model: Any, y: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        """(N, horizon) forecasts of one fitted model from every origin of ``y``."""


class ETS(StatsforecastAnchor):
    """Exponential smoothing with an additive season and the error and trend types chosen by AICc
    (statsforecast's AutoETS, model "ZZA", season = ``period``): a multiplicative season, which
    "ZZZ" may pick, turned the zeros of PV and of night-time counts into forecasts off by MASE 1.5-4.4
    on bench/value.py's homes and pedestrians ("ZZA": 1.08-1.20). Its parameters come from the
    history; its state is filtered over every row before the origin (one pass over the series, then
    each origin's forecast from its state)."""

    name: ClassVar[str] = "ets"
    seasons_needed: ClassVar[int] = 2

    def _model(self) -> Any:
        from statsforecast.models import AutoETS

        return AutoETS(season_length=self.period, model="ZZA")

    def _series_forecasts(self, model: Any, y: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        from statsforecast.ets import forecast_ets, forward_ets

        filtered = forward_ets(model.model_, y)
        return np.stack([forecast_ets({**filtered, "states": filtered["states"][: o + 1]}, horizon)["mean"]
                         for o in origins]) if len(origins) else np.empty((0, horizon))


class SeasonalRefit(StatsforecastAnchor):
    """A statsforecast model applied to the last ``CONTEXT_SEASONS`` seasons before the first row of
    each season: every origin of that season forecasts from there (``forward`` re-runs the
    model's decomposition, tens of milliseconds; once a day is what a gateway would do anyway)."""

    CONTEXT_SEASONS: ClassVar[int] = 28

    def _series_forecasts(self, model: Any, y: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        context = self.CONTEXT_SEASONS * self.period
        out = np.empty((len(origins), horizon))
        days = origins - origins % self.period
        for day in np.unique(days):
            path = model.forward(y[max(0, day - context):day], h=self.period - 1 + horizon)["mean"]
            for i in np.flatnonzero(days == day):
                shift = origins[i] - day
                out[i] = path[shift: shift + horizon]
        return out


class Theta(SeasonalRefit):
    """The Theta method with its variant chosen on the history (statsforecast's AutoTheta, season =
    ``period``), refitted on the last four weeks at the first row of each season."""

    name: ClassVar[str] = "theta"
    seasons_needed: ClassVar[int] = 2

    def _model(self) -> Any:
        from statsforecast.models import AutoTheta

        return AutoTheta(season_length=self.period)


class MSTL(SeasonalRefit):
    """Daily and weekly seasonal components by MSTL with an AutoETS trend (statsforecast's MSTL),
    refitted on the last four weeks at the first row of each season."""

    name: ClassVar[str] = "mstl"
    seasons_needed: ClassVar[int] = 2 * SEASONS_PER_WEEK + 1

    def _model(self) -> Any:
        from statsforecast.models import MSTL as StatsforecastMSTL

        return StatsforecastMSTL(season_length=[self.period, self.period * SEASONS_PER_WEEK])


def lookback_rule(name: str, lookback: int, horizon: int, period: int) -> tuple[np.ndarray, np.ndarray]:
    """An anchor that needs nothing but the model's lookback window, as rows of that window (K, H)
    and their weights (K,): forecast step h = sum_k weight_k * window[rows[k, h]]. Only the
    seasonal rules are such anchors; ValueError for the others or a lookback too short."""
    rules = {SeasonalNaive.name: (period, 1), WeeklyNaive.name: (period * SEASONS_PER_WEEK, 1),
             WindowAverage.name: (period, WindowAverage.seasons_needed)}
    if name not in rules:
        raise ValueError(f"anchor {name!r} needs the whole history; the lookback anchors are {sorted(rules)}")
    season, count = rules[name]
    if lookback < season * count:
        raise ValueError(f"anchor {name!r} needs a lookback of {season * count} steps, the model has {lookback}")
    origin = np.array([lookback])
    rows = np.stack([seasonal_rows(origin, horizon, season, back)[0] for back in range(1, count + 1)])
    return rows, np.full(count, 1.0 / count)


ANCHORS: dict[str, Callable[[int], Anchor]] = {
    anchor.name: anchor for anchor in (SeasonalNaive, WeeklyNaive, WindowAverage, ETS, Theta, MSTL)
}


def make_anchor(name: str, period: int) -> Anchor:
    """The anchor registered as ``name`` for ``period`` rows per season."""
    from edge_agent.registry import registered

    return ANCHORS[registered(name, ANCHORS, "anchor")](period)


def fitted_forecasts(name: str, period: int, history: np.ndarray, series: np.ndarray, origins: np.ndarray,
                     horizon: int, fitted: dict) -> np.ndarray | None:
    """Anchor ``name``'s forecasts (N, horizon, F) from every origin row of ``series``, fitted on
    ``history`` (its first rows) once: the fitted anchor is kept in ``fitted`` under ``("fitted",
    name)`` for the next split. None where the history is too short for the anchor."""
    anchor = make_anchor(name, period)
    if len(history) < anchor.min_history:
        return None
    if ("fitted", name) not in fitted:
        fitted["fitted", name] = anchor.fit(history)
    return fitted["fitted", name].forecast(series, origins, horizon)



def partial_season_naive(series: np.ndarray, period: int, horizon: int) -> np.ndarray:
    """Seasonal naive from less than one season of history: each step repeats the latest row of its
    own phase where the history has one, else the last row (H, F)."""
    data = filled(series)
    rows = len(data) - period + np.arange(horizon) % period
    return data[np.where(rows >= 0, rows, len(data) - 1)]


def short_history_forecast(series: np.ndarray, period: int, horizon: int,
                           names: tuple[str, ...] = RECIPE_ANCHORS) -> tuple[str, np.ndarray, str]:
    """The best forecast a gateway with too little history for a validation split can make: each
    anchor it can fit forecasts the last season of its own history from the rows before it, the
    one with the lowest mean absolute error forecasts the next ``horizon`` rows from all of them.
    Returns its name, the forecast (H, F) and a sentence saying how it was chosen."""
    rows = len(series)
    if rows < period:
        return ("seasonal_naive", partial_season_naive(series, period, horizon),
                f"{rows} rows are less than one season ({period}): seasonal naive over what there is")
    errors = {}
    for name in names:
        anchor = ANCHORS[name](period)
        if rows - period >= anchor.min_history:
            past = anchor.fit(series[: rows - period]).forecast(series, np.array([rows - period]), period)[0]
            errors[name] = float(np.nanmean(np.abs(past - series[rows - period:])))
    if not errors:
        return "seasonal_naive", SeasonalNaive(period).forecast(series, np.array([rows]), horizon)[0], \
            f"{rows} rows leave no season to test on: seasonal naive"
    best = min(errors, key=errors.__getitem__)
    forecast = ANCHORS[best](period).fit(series).forecast(series, np.array([rows]), horizon)[0]
    tried = ", ".join(f"{name} {error:.4g}" for name, error in errors.items())
    return best, forecast, f"chosen on the last season of its history (mean absolute error: {tried})"
