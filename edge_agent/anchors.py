"""Anchors: the forecasts a gateway can make alone, with nothing to train and no fleet to join.

Seasonal naive a day and a week back, the seasonal window average (the mean of the same hour over
the last seven days) and statsforecast's ETS, Theta and MSTL (Nixtla; not hand-written). Every
learned forecast is scored beside them on the same windows and scale, and a gateway serves an
anchor wherever that validates better than its learned models (``edge_agent.selection``). One
anchor is one small class registered in ``ANCHORS``.

Every anchor forecasts many origins of one series at once: ``forecast(series, origins, horizon)``
returns, for each origin row ``o``, the ``horizon`` rows from ``o`` on, using only
``series[:o]``. ``series`` starts at the first row of the gateway's history (the rows ``fit`` saw
come first); missing values are carried forward from the last observed one. ETS and Theta learn
their parameters from the history (``learns``: a gateway refits them every round) and run them
over the later rows; the seasonal rules and MSTL only look back from each origin, so they forecast
every origin with enough rows before it, however short the training split. Each statsforecast
anchor's docstring states its cost per feature, measured on this machine (2 CPU cores shared with
other jobs; best of 3, ``time.perf_counter``) on a year of Greensboro's hourly air temperature.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

from edge_agent.recipe import ANCHORS as RECIPE_ANCHORS

SEASONS_PER_WEEK = 7


class Anchor(ABC):
    """One simple forecaster of ``period`` rows per season (a day of hourly data: 24)."""

    name: ClassVar[str]
    seasons_needed: ClassVar[int] = 1  # whole seasons of rows before an origin it can forecast
    learns: ClassVar[bool] = False  # True: ``fit`` estimates from the history what ``forecast`` uses

    def __init__(self, period: int) -> None:
        if period < 1:
            raise ValueError(f"{self.name}: period must be >= 1 row, got {period}")
        self.period = period

    @property
    def min_history(self) -> int:
        """Rows this anchor needs before an origin (and in its history, if it learns from it)."""
        return self.seasons_needed * self.period

    def can_forecast(self, history_rows: int, origins: np.ndarray) -> bool:
        """True when every origin has ``min_history`` rows before it and, for an anchor that learns
        from its history, the ``history_rows`` hold as many: an anchor that only looks back from each
        origin forecasts the later windows of a client whose training split is shorter than it needs."""
        origins = np.asarray(origins)
        enough_before = origins.size == 0 or int(origins.min()) >= self.min_history
        return enough_before and (history_rows >= self.min_history or not self.learns)

    def fit(self, history: np.ndarray) -> Anchor:
        """Learn whatever the anchor learns from ``history`` (rows x features, data units)."""
        if self.learns and len(history) < self.min_history:
            raise ValueError(f"{self.name} needs {self.min_history} rows of history, has {len(history)}")
        self._fit(filled(history))
        return self

    def _fit(self, history: np.ndarray) -> None:
        """Nothing to fit by default (the anchors that look back from each origin)."""

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


@contextmanager
def quiet() -> Iterator[None]:
    """statsforecast's optimizers warn about candidate models they reject (overflow, bounds); the
    anchors are judged by their scores, so those warnings are silenced where they are fitted."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


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


class ETS(Anchor):
    """Exponential smoothing with an additive season (statsforecast's AutoETS, model "ZZA", season
    = ``period``, error and trend types chosen by AICc; Hyndman & Khandakar 2008); below two
    seasons of history the non-seasonal form ("ZZN"): a seasonal state fitted on one observation
    per phase is no model of the season. Its sibling ``ETSNoSeason`` always fits "ZZN", and a
    gateway's own selection (``edge_agent.choice``: errors 1 to ``horizon`` steps ahead on its
    latest known windows) picks between them, not AICc: AICc weighs one-step fit, and letting it
    choose the form (AutoETS's rule without the multiplicative season, which turned the zeros of PV
    and of night-time counts into forecasts off by MASE 1.5-4.4 on bench/value.py's homes and
    pedestrians) scored 1.141 and 1.103 test MASE on bench/value.py's station clients with 14 and
    30 days of history, where the additive season alone scored 1.041 and 0.928 (development data).

    The parameters come from the last ``FIT_SEASONS`` seasons of the history; the state is filtered
    with them from the first of those rows through every later row, and each origin forecasts from
    the state there (statsforecast's ``cross_validation`` with ``refit=False``). A gateway refits
    at every round, on that round's history. Cost per hourly feature: a fit 0.09 s on 14 days, 0.36 s
    on the 56 it keeps (2.3 s on a year; ``ETSNoSeason`` 0.007, 0.03 and 0.12 s); filtering a year and forecasting from each of its 7,392
    hourly origins 0.04 s. On the 58 features of the seven bundled pvlib weather sites (a 292-day
    training split, daily test origins, 24 h ahead) fitting on the last 56 days instead of all 292
    took a fifth of the time and moved the mean MASE from 1.205 to 1.210."""

    name: ClassVar[str] = "ets"
    learns: ClassVar[bool] = True
    FIT_SEASONS: ClassVar[int] = 56
    MIN_ROWS: ClassVar[int] = 7  # statsforecast's ets_f refuses n <= 6 for a non-seasonal model ("tiny datasets")

    def __init__(self, period: int) -> None:
        super().__init__(period)
        self.models: list[dict[str, Any]] = []
        self.start = 0

    @property
    def min_history(self) -> int:
        """One season of rows, and at least what statsforecast fits a non-seasonal model on."""
        return max(super().min_history, self.MIN_ROWS)

    def form(self, rows: int) -> str:
        """The AutoETS model string fitted on ``rows`` rows: the additive season from two seasons on."""
        return "ZZA" if self.period > 1 and rows >= 2 * self.period else "ZZN"

    def choose(self, y: np.ndarray) -> dict[str, Any]:
        """statsforecast's fitted model dict on ``y`` (its ``components`` say which form AICc chose
        within it: e.g. "ANAN", additive error, no trend, additive season)."""
        from statsforecast.models import AutoETS

        return AutoETS(season_length=self.period, model=self.form(len(y))).fit(y).model_

    def _fit(self, history: np.ndarray) -> None:
        self.start = max(0, len(history) - self.FIT_SEASONS * self.period)
        with quiet():
            self.models = [self.choose(history[self.start:, f]) for f in range(history.shape[1])]

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if len(self.models) != series.shape[1]:
            raise ValueError(f"{self.name}: fitted on {len(self.models)} features, asked for {series.shape[1]}")
        if origins.size and origins.min() < self.start:
            raise ValueError(f"{self.name}: origins must lie after row {self.start}, where its state starts")
        out = np.empty((len(origins), horizon, series.shape[1]))
        with quiet():
            for f, model in enumerate(self.models):
                out[:, :, f] = self._feature_forecasts(model, series[self.start:, f], origins - self.start, horizon)
        return out

    @staticmethod
    def _feature_forecasts(model: dict[str, Any], y: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        """(N, horizon): ``model``'s state filtered over ``y`` once (statsforecast's ``forward_ets``),
        then a forecast from its state after row ``o - 1`` for every origin ``o`` of ``y``."""
        from statsforecast.ets import forecast_ets, forward_ets

        if not len(origins):
            return np.empty((0, horizon))
        filtered = forward_ets(model, y)
        return np.stack([forecast_ets({**filtered, "states": filtered["states"][: o + 1]}, horizon)["mean"]
                         for o in origins])


class ETSNoSeason(ETS):
    """``ETS`` without a season ("ZZN": level and trend chosen by AICc): the better forecast where
    a series' days do not repeat (on hourly weather with two weeks of history, pressure and wind),
    as a gateway's own validation windows say (``ETS``'s docstring says why not AICc)."""

    name: ClassVar[str] = "ets_noseason"

    def form(self, rows: int) -> str:
        return "ZZN"


class DailyPaths(Anchor):
    """A statsforecast model run at the first row of each season (day) of the origins on the last
    ``CONTEXT_SEASONS`` seasons before it: every origin of that season forecasts from there."""

    CONTEXT_SEASONS: ClassVar[int] = 28

    def context(self, y: np.ndarray, end: int) -> np.ndarray:
        """The last ``CONTEXT_SEASONS`` seasons of ``y`` before row ``end`` (fewer where ``y`` has fewer)."""
        return y[max(0, end - self.CONTEXT_SEASONS * self.period): end]

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        out = np.empty((len(origins), horizon, series.shape[1]))
        days = origins - origins % self.period
        with quiet():
            for day in np.unique(days):
                rows = np.flatnonzero(days == day)
                steps = origins[rows, None] - day + np.arange(horizon)
                for f in range(series.shape[1]):
                    path = self._path(f, self.context(series[:, f], int(day)), int(steps.max()) + 1)
                    out[rows, :, f] = path[steps]
        return out

    @abstractmethod
    def _path(self, feature: int, context: np.ndarray, steps: int) -> np.ndarray:
        """The forecast of the next ``steps`` rows of ``feature`` after ``context``."""


class Theta(DailyPaths):
    """The Theta method with its variant chosen as statsforecast's AutoTheta chooses it (season =
    ``period``), fitted on the last four weeks of the history and applied with those parameters to
    the last four weeks before the first row of each season (AutoTheta's ``forward``): statsforecast's
    ``cross_validation`` with ``refit=False``, ``input_size`` = four weeks and a day's step. A gateway
    refits at every round, on that round's history. Cost per feature: the fit 48 ms (17 ms on 14
    days; 7.7 s were it fitted on a year); a day's origins 1.0 ms (one ``forward``, which re-runs
    the seasonality test and decomposition: hence once a day). Refitting every day and applying the
    day's fit at every origin scored 0.819 instead of 0.835 (test MASE) on bench/value.py's station
    clients with 14 days of history, at 31 times the cost."""

    name: ClassVar[str] = "theta"
    seasons_needed: ClassVar[int] = 2
    learns: ClassVar[bool] = True

    def __init__(self, period: int) -> None:
        super().__init__(period)
        self.models: list[Any] = []

    def _fit(self, history: np.ndarray) -> None:
        from statsforecast.models import AutoTheta

        with quiet():
            self.models = [AutoTheta(season_length=self.period).fit(self.context(history[:, f], len(history)))
                           for f in range(history.shape[1])]

    def _forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if len(self.models) != series.shape[1]:
            raise ValueError(f"{self.name}: fitted on {len(self.models)} features, asked for {series.shape[1]}")
        return super()._forecast(series, origins, horizon)

    def _path(self, feature: int, context: np.ndarray, steps: int) -> np.ndarray:
        return self.models[feature].forward(context, h=steps)["mean"]


class MSTL(DailyPaths):
    """Daily and weekly seasonal components by MSTL with an AutoETS trend (statsforecast's MSTL),
    refitted at the first row of each season on the last four weeks before it, whatever the training
    split: statsforecast's ``cross_validation`` with ``refit=True``, ``input_size`` = four weeks and
    a day's step. More than two weeks before the origin, as R's forecast::mstl keeps a season only
    while the series holds more than two of it. A refit costs about what a ``forward`` with fixed
    parameters does (both re-run the STL decomposition), so it refits rather than filters; and once
    a season, not at every origin, which would cost ``period`` times as much. Cost per feature: a
    refit (a day's origins) 0.19 s on four weeks, 0.10 s on two, so a year of days 68 s (a single fit
    on a year: 2.2 s). Four weeks of context, because less was cheaper and worse: refitted every
    third test day on the 58 features of the bundled pvlib weather sites (24 h ahead), four, three
    and two weeks gave a mean MASE of 1.046, 1.061 and 1.160."""

    name: ClassVar[str] = "mstl"
    seasons_needed: ClassVar[int] = 2 * SEASONS_PER_WEEK + 1

    def _path(self, feature: int, context: np.ndarray, steps: int) -> np.ndarray:
        from statsforecast.models import MSTL as StatsforecastMSTL

        model = StatsforecastMSTL(season_length=[self.period, self.period * SEASONS_PER_WEEK])
        return model.forecast(context, h=steps)["mean"]


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
    anchor.name: anchor for anchor in (SeasonalNaive, WeeklyNaive, WindowAverage, ETS, ETSNoSeason, Theta, MSTL)
}


def make_anchor(name: str, period: int) -> Anchor:
    """The anchor registered as ``name`` for ``period`` rows per season."""
    from edge_agent.registry import registered

    return ANCHORS[registered(name, ANCHORS, "anchor")](period)


def fitted_forecasts(name: str, period: int, history: np.ndarray, series: np.ndarray, origins: np.ndarray,
                     horizon: int, fitted: dict) -> np.ndarray | None:
    """Anchor ``name``'s forecasts (N, horizon, F) from every origin row of ``series``, fitted on
    ``history`` (its first rows) once: the fitted anchor is kept in ``fitted`` under ``("fitted",
    name)`` for the next split. None where an origin has too few rows before it or, for an anchor
    that learns from its history (``Anchor.learns``), the history is too short."""
    anchor = make_anchor(name, period)
    if not anchor.can_forecast(len(history), origins):
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
