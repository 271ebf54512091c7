"""What a gateway that has just joined serves before it holds the rows local training needs: the
fleet's model, one of its anchors or (with ``training.median``) their median, whichever forecast
its own recent days best by the product's rule (``edge_agent.choice``), the fleet's model while no
outcome is known yet.

The fleet's model needs a lookback the gateway may not hold yet: the rows it has are kept and each
earlier position takes the earliest row of the same phase of the season (``seasonal_fill``), as a
seasonal naive forecast would fill it backwards. Every candidate is replayed as it would have run
on each past day (an anchor refitted at the start of the day on the rows held then, the model
standardized on them), so no choice rests on a forecast made with rows the gateway did not hold
yet; scores are MASE on the rows held (``own_scale``). bench/time_to_value.py measures this path
over a newcomer's first 30 days."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from edge_agent.anchors import filled, make_anchor
from edge_agent.candidates import FEDERATED, MEAN_OF_BEST, MEDIAN
from edge_agent.choice import choose_at, recent_score
from edge_agent.data.arrays import StandardScaler, time_features
from edge_agent.learners.head import client_model
from edge_agent.models import ModelConfig
from edge_agent.tensors import TensorDict
from edge_agent.scoring import seasonal_naive_mae, spread

FLEET = FEDERATED


def seasonal_fill(rows: np.ndarray, lookback: int, period: int) -> np.ndarray:
    """(lookback, F): the latest ``lookback`` of ``rows`` (n, F; NaN where missing, carried
    forward), positions before the first row filled from the earliest row of the same phase
    (``period`` rows per season); with less than one season, phases not yet seen take the
    first row. Raises ValueError for no rows at all."""
    if len(rows) == 0:
        raise ValueError("seasonal_fill: no rows to fill a lookback from")
    if lookback < 1 or period < 1:
        raise ValueError(f"seasonal_fill: lookback {lookback} and period {period} must be >= 1")
    data = filled(np.asarray(rows, dtype=np.float64))
    n = len(data)
    if n >= lookback:
        return data[-lookback:]
    positions = np.arange(lookback) - (lookback - n)
    source = positions + np.ceil(np.maximum(-positions, 0) / period).astype(int) * period
    return data[np.where(source < n, source, 0)]


def own_scale(rows: np.ndarray, period: int) -> np.ndarray:
    """Per feature, the in-sample seasonal naive error of ``rows`` (MASE's denominator), its spread
    where that is zero or undefined (less than two seasons, a constant feature)."""
    naive, fallback = seasonal_naive_mae(rows, period), spread(rows)
    return np.where(np.isfinite(naive) & (naive > 1e-7 * fallback), naive, fallback)


def window_errors(forecasts: np.ndarray, values: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """(N, F) mean absolute error per window and feature of ``forecasts`` (N, H, F) against the
    rows of ``values`` after each origin; NaN where an outcome is not held or misses a value."""
    out = np.full((len(origins), values.shape[1]), np.nan)
    for j, origin in enumerate(origins):
        if origin + horizon <= len(values):
            out[j] = np.abs(forecasts[j] - values[origin:origin + horizon]).mean(axis=0)
    return out


def received_model(model_config: ModelConfig, n_features: int, state: TensorDict, seed: int,
                   client_index: int = 0) -> nn.Module:
    """The fleet's model as a gateway of ``n_features`` features receives it: the global ``state``
    installed in its own model (a recipe whose head is shared too)."""
    model = client_model(model_config, n_features, seed, client_index)
    model.load_shared_state(state)
    return model.eval()


def window_mase(errors: dict[str, np.ndarray], scale: np.ndarray) -> dict[str, np.ndarray]:
    """Each candidate's MASE per window for the rule of ``edge_agent.choice``: its per-window
    errors (``errors`` (N, F)) divided by ``scale``, mean over features (NaN where a window misses
    an outcome or a forecast)."""
    return {name: (error / scale).mean(axis=1) for name, error in errors.items()}


def with_median(forecasts: dict[str, np.ndarray], median: bool = True) -> dict[str, np.ndarray]:
    """``forecasts`` (each (N, H, F), NaN where a candidate has none) and, with ``median`` and at
    least three of them, their median (``MEDIAN``), as the regular path combines its candidates
    (``edge_agent.selection``): per window over the members that forecast it, NaN where fewer than
    three do (with an even count the mean of the two middle ones, as ``median_forecast``)."""
    if not median or len(forecasts) < 3:
        return forecasts
    stacked = np.stack(list(forecasts.values()))
    present = np.isfinite(stacked).all(axis=(2, 3))
    enough = present.sum(axis=0) >= 3
    members = np.where(present[:, :, None, None], stacked, np.nan)
    combined = np.full(stacked.shape[1:], np.nan)
    combined[enough] = np.nanmedian(members[:, enough], axis=0)
    return {**forecasts, MEDIAN: combined}


@dataclass(frozen=True)
class Newcomer:
    """A gateway's rows since it joined (``values`` (n, F), data units, NaN where missing; the
    first at ``start``, one every ``step``) and the model's windows in rows."""

    values: np.ndarray
    start: pd.Timestamp
    step: pd.Timedelta
    period: int
    lookback: int
    horizon: int

    def day_origins(self, day: int) -> np.ndarray:
        """The forecast origins of day ``day`` (1 = the day after the first whole day held), up
        to the present (the row after the last one held)."""
        return np.arange(day * self.period, min((day + 1) * self.period, len(self.values) + 1))

    def anchor_forecasts(self, name: str, day: int) -> np.ndarray | None:
        """Anchor ``name`` fitted on the rows held at the start of ``day``, forecasting the day's
        origins (N, H, F); None while it needs more rows."""
        held, origins = day * self.period, self.day_origins(day)
        anchor = make_anchor(name, self.period)
        if not anchor.can_forecast(held, origins):
            return None
        return anchor.fit(self.values[:held]).forecast(self.values, origins, self.horizon)

    @torch.no_grad()
    def model_forecasts(self, model: nn.Module, day: int, scaler: StandardScaler | None = None) -> np.ndarray:
        """``model``'s forecasts (N, H, F) of the day's origins from the rows before each (a
        lookback filled by season while fewer are held), standardized with ``scaler`` or the
        statistics of the rows held at the start of the day."""
        held, origins = day * self.period, self.day_origins(day)
        if scaler is None:
            rows = self.values[:held]
            scaler = StandardScaler().fit(rows[~np.isnan(rows).any(axis=1)])
        context = np.stack([seasonal_fill(self.values[:o], self.lookback, self.period) for o in origins])
        marks = np.stack([time_features(self.stamps(o)) for o in origins])
        x = torch.as_tensor(scaler.transform(context), dtype=torch.float32)
        return scaler.inverse_transform(model.eval()(x, torch.as_tensor(marks)).numpy())

    def stamps(self, origin: int) -> pd.DatetimeIndex:
        """The timestamps of the lookback before ``origin``, before the first row too."""
        return pd.DatetimeIndex(self.start + self.step * np.arange(origin - self.lookback, origin))


def newcomer_forecast(newcomer: Newcomer, fleet_model: nn.Module, anchors: tuple[str, ...],
                      selection_days: int, median: bool = False, combine: int = 1
                      ) -> tuple[str, np.ndarray, dict[str, float]]:
    """What the gateway serves now, the next ``horizon`` rows (H, F) and every candidate's recent
    MASE: the fleet's model, an anchor or (with ``median``) their median, each replayed over the
    days held (``Newcomer``), or the mean of the ``combine`` best (``MEAN_OF_BEST``)."""
    present, period, horizon = len(newcomer.values), newcomer.period, newcomer.horizon
    days = range(1, present // period + 1)
    origins = np.concatenate([newcomer.day_origins(day) for day in days])
    forecasts: dict[str, list] = {FLEET: [newcomer.model_forecasts(fleet_model, day) for day in days]}
    for name in anchors:
        per_day = [newcomer.anchor_forecasts(name, day) for day in days]
        if per_day[-1] is not None:
            forecasts[name] = [np.full((len(newcomer.day_origins(d)), horizon, newcomer.values.shape[1]), np.nan)
                               if f is None else f for d, f in zip(days, per_day)]
    stacked = with_median({name: np.concatenate(parts) for name, parts in forecasts.items()}, median)
    errors = {name: window_errors(f, newcomer.values, origins, horizon) for name, f in stacked.items()}
    half_life = selection_days * period if selection_days else None
    per_window = window_mase(errors, own_scale(newcomer.values, period))
    scores = {name: recent_score(e, origins, horizon, present, half_life) for name, e in per_window.items()}
    picks = choose_at(per_window, origins, horizon, present, half_life, combine)
    which = picks[0] if len(picks) == 1 else MEAN_OF_BEST
    return which, np.mean([stacked[name][-1] for name in picks], axis=0), scores
