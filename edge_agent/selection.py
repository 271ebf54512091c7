"""What a gateway serves: the best of everything it can make, chosen on its own validation windows.

The candidates are its federated model, its local-only model (``keep_local``), the anchors
(``edge_agent.anchors``) it is allowed to serve, fitted on its own history, and the median of its
models and anchors (``median``; ``edge_agent.models.combination``). Each is scored on the
same windows and scale (``Metrics.score`` per window: MASE for point forecasts), over the latest
``selection_days`` days of windows whose outcome is known (0: every validation window), and the
lowest wins; a tie goes to the candidate listed first (federated, local, the anchors in order, the
median). Recent errors, because which candidate wins moves with the seasons: on the homes the
validation months (Sep-Oct) favour other candidates than the test weeks (Nov-Dec), and a gateway
re-choosing on its last two weeks of outcomes follows that (README, "Does joining the fleet pay?").
This extends FedPer's personalization with the oldest rule of forecasting practice: never serve
a model that loses to what the data's own seasonality gives for free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from edge_agent.anchors import fitted_forecasts, lookback_rule
from edge_agent.data import ClientData, WindowSet
from edge_agent.metrics import pinball_terms
from edge_agent.models import Forecaster
from edge_agent.models.combination import median_forecast
from edge_agent.models.seasonal import LookbackAnchor
from edge_agent.scoring import Scale, scaled_errors
from edge_agent.train import Batch, Metrics, forecast_metrics, forecasts

SPLITS = ("train", "val", "test")
MEDIAN = "median"  # the candidate that combines the others (``edge_agent.models.combination``)


def split_windows(client: ClientData, split: str) -> WindowSet:
    """The client's windows of ``split`` (train, val or test)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return getattr(client, split)


def anchor_forecasts(client: ClientData, name: str, split: str) -> np.ndarray | None:
    """Anchor ``name``'s forecasts (N, H, F) in data units for every window of ``split``, fitted on
    the client's history; None where that history is too short for it. Kept on the client, so an
    anchor is fitted and run once per client whatever the number of methods and seeds."""
    key = (name, split)
    if key not in client.memo:
        windows = split_windows(client, split)
        client.memo[key] = fitted_forecasts(name, client.period, client.history, client.raw, windows.origins(),
                                            windows.horizon, client.memo)
    return client.memo[key]


def anchor_batches(client: ClientData, name: str, split: str) -> list[Batch] | None:
    """An anchor's (forecast, target) on the client's normalized scale, as one batch (None: too
    little history for it)."""
    values = anchor_forecasts(client, name, split)
    if values is None:
        return None
    normalized = torch.as_tensor(client.scaler.transform(values.astype(np.float32)), dtype=torch.float32)
    return [(normalized, split_windows(client, split).targets())]


def anchor_metrics(client: ClientData, name: str, split: str) -> Metrics | None:
    """An anchor's metrics on the windows of ``split``, scored like every model's (None: too little history)."""
    batches = anchor_batches(client, name, split)
    return None if batches is None else forecast_metrics(batches, None, None, split_windows(client, split).scale)


@dataclass(frozen=True)
class Served:
    """What one gateway serves: ``which`` candidate ("federated", "local", an anchor's name or
    "median"), its model (None for an anchor and the median), every candidate's validation score
    (NaN: not available) and, for the median, its members by name (a model, None for an anchor)."""

    which: str
    model: Forecaster | None
    scores: dict[str, float] = field(default_factory=dict)
    members: dict[str, nn.Module | None] = field(default_factory=dict)

    @property
    def is_anchor(self) -> bool:
        return self.model is None and self.which != MEDIAN

    def batches(self, client: ClientData, split: str) -> list[Batch]:
        """(forecast, target) batches of the served candidate over ``split`` on the normalized scale."""
        if self.which == MEDIAN:
            return median_batches([candidate_batches(client, name, model, split)
                                   for name, model in self.members.items()])
        return candidate_batches(client, self.which, self.model, split) or []

    def metrics(self, client: ClientData, split: str) -> Metrics:
        """The served candidate's metrics over ``split``."""
        levels = None if self.model is None else self.model.levels
        return forecast_metrics(self.batches(client, split), levels, None, split_windows(client, split).scale)


def candidate_batches(client: ClientData, name: str, model: nn.Module | None, split: str) -> list[Batch] | None:
    """A model's (``model``) or an anchor's (``name``) batches over ``split`` (None: an anchor
    with too little history)."""
    if model is None:
        return anchor_batches(client, name, split)
    return list(forecasts(model, split_windows(client, split)))


def median_batches(members: Sequence[list[Batch] | None]) -> list[Batch]:
    """One batch: the median of the members' forecasts (those that have any) and the target."""
    present = [batches for batches in members if batches]
    forecast = median_forecast(torch.stack([torch.cat([f for f, _ in batches]) for batches in present]))
    return [(forecast, torch.cat([y for _, y in present[0]]))]


def choose(scores: dict[str, float]) -> str:
    """The candidate with the lowest finite score, the first listed on a tie or when none has a
    finite score (a diverged model is still what a gateway with nothing else serves)."""
    if not scores:
        raise ValueError("choose: no candidates")
    finite = {name: score for name, score in scores.items() if math.isfinite(score)}
    return min(finite, key=finite.__getitem__) if finite else next(iter(scores))


@torch.no_grad()
def window_metrics(batches: Iterable[Batch], scale: Scale | None) -> dict[str, np.ndarray]:
    """Per window (N,) of point forecasts: MSE and MAE on the reference scale and MASE (NaN without
    a scale), each the mean over the window's steps and features; their means over the windows
    are ``forecast_metrics``' (every window has as many elements)."""
    parts: dict[str, list[np.ndarray]] = {"mse": [], "mae": [], "mase": []}
    for forecast, y in batches:
        error, mase = scaled_errors(forecast - y, scale)
        for name, terms in (("mse", error.pow(2)), ("mae", error.abs()), ("mase", mase)):
            parts[name].append(terms.flatten(1).mean(1).double().numpy())
    return {name: np.concatenate(values) if values else np.zeros(0) for name, values in parts.items()}


@torch.no_grad()
def window_scores(batches: Iterable[Batch], levels: Sequence[float] | None, scale: Scale | None) -> np.ndarray:
    """Each window's ``Metrics.score`` (N,): QS of quantile forecasts, else MASE, else (no scale) MSE."""
    if levels is None:
        per_window = window_metrics(batches, scale)
        return per_window["mse"] if scale is None else per_window["mase"]
    parts, factor = [], torch.ones(1) if scale is None else scale.reference
    for forecast, y in batches:
        parts.append((pinball_terms(forecast, y, levels) * factor.unsqueeze(-1)).flatten(1).mean(1).double().numpy())
    return np.concatenate(parts) if parts else np.zeros(0)


def recent_score(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, span: int | None) -> float:
    """Mean of the per-window ``scores`` over the windows whose outcome is known at row ``at``
    (origin + horizon <= at) and that start at most ``span`` rows before it (None: all known);
    NaN where there is none."""
    known = origins + horizon <= at
    if span is not None:
        known &= origins >= at - span
    return float(scores[known].mean()) if known.any() else math.nan


def selection_span(client: ClientData, selection_days: int) -> int | None:
    """``selection_days`` in rows of the client's data (None: 0 days, every window)."""
    return selection_days * client.period if selection_days else None


def lookback_anchor(client: ClientData, name: str) -> LookbackAnchor:
    """Anchor ``name`` as a module over the model's lookback window (``fits_window`` says whether it can be)."""
    return LookbackAnchor(name, client.val.lookback, client.val.horizon, client.period)


def fits_window(anchor: str, windows: WindowSet, period: int) -> bool:
    """True when ``anchor`` needs nothing but the lookback window of ``windows``."""
    try:
        lookback_rule(anchor, windows.lookback, windows.horizon, period)
    except ValueError:
        return False
    return True


def select(client: ClientData, models: dict[str, nn.Module], anchors: Sequence[str], median: bool = False,
           selection_days: int = 0) -> Served:
    """What the gateway serves: among ``models``, the ``anchors`` and (with ``median``, point models
    and at least three members) the median of them all, the candidate with the lowest score over
    its latest ``selection_days`` days of validation windows (0: all of them)."""
    val = client.val
    members: dict[str, nn.Module | None] = {**models, **dict.fromkeys(anchors)}
    batches = {name: candidate_batches(client, name, model, "val") for name, model in members.items()}
    members = {name: model for name, model in members.items() if batches[name] is not None}
    levels = {name: model.levels for name, model in models.items() if model.levels}
    windows = {name: window_scores(b, levels.get(name), val.scale) for name, b in batches.items() if b is not None}
    if median and len(members) >= 3 and not levels:
        windows[MEDIAN] = window_scores(median_batches(list(batches.values())), None, val.scale)
    origins, horizon = val.origins(), val.horizon
    at = int(origins.max()) + horizon if len(origins) else 0
    span = selection_span(client, selection_days)
    scores = {name: math.nan for name in [*models, *anchors]}
    scores |= {name: recent_score(errors, origins, horizon, at, span) for name, errors in windows.items()}
    which = choose(scores)
    return Served(which, models.get(which), scores, members if which == MEDIAN else {})


def best_anchor(client: ClientData, names: Sequence[str]) -> Served:
    """The anchor a gateway serves when it has nothing learned to serve."""
    return select(client, {}, names)



def anchor_quantile_metrics(client: ClientData, name: str, levels: Sequence[float]) -> Metrics | None:
    """Test metrics of an anchor turned into quantile forecasts by split conformal prediction: each
    level's forecast is the point forecast plus that level's empirical quantile of the anchor's own
    validation residuals, per horizon step and feature (the residual-quantile intervals of
    conformal regression; Lei et al. 2018). None where the history is too short for the anchor."""
    val, test = anchor_batches(client, name, "val"), anchor_batches(client, name, "test")
    if val is None or test is None:
        return None
    (val_forecast, val_target), (test_forecast, test_target) = val[0], test[0]
    offsets = torch.quantile(val_target - val_forecast, torch.tensor(list(levels)), dim=0)  # (Q, H, F)
    quantiles = test_forecast.unsqueeze(-1) + offsets.permute(1, 2, 0)
    return forecast_metrics([(quantiles, test_target)], levels, None, client.test.scale)
