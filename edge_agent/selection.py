"""What a gateway serves: the best of everything it can make, chosen on its own validation windows.

The candidates are its federated model, its local-only model (``keep_local``) and the anchors
(``edge_agent.anchors``) it is allowed to serve, fitted on its own history. Each is scored on the
same validation windows and scale (``Metrics.score``: MASE for point forecasts) and the lowest
wins; a tie goes to the candidate listed first (federated, local, then the anchors in order).
This extends FedPer's personalization with the oldest rule of forecasting practice: never serve
a model that loses to what the data's own seasonality gives for free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from edge_agent.anchors import make_anchor
from edge_agent.data import ClientData, WindowSet
from edge_agent.models import Forecaster
from edge_agent.train import Batch, Metrics, forecast_metrics, forecasts

SPLITS = ("train", "val", "test")


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
        anchor = make_anchor(name, client.period)
        if len(client.history) < anchor.min_history:
            client.memo[key] = None
        else:
            fitted = client.memo.setdefault(("fitted", name), anchor.fit(client.history))
            client.memo[key] = fitted.forecast(client.raw, windows.origins(), windows.horizon)
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
    """What one gateway serves: ``which`` candidate ("federated", "local" or an anchor's name),
    its model (None for an anchor) and every candidate's validation score (NaN: not available)."""

    which: str
    model: Forecaster | None
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def is_anchor(self) -> bool:
        return self.model is None

    def batches(self, client: ClientData, split: str) -> Iterable[Batch]:
        """(forecast, target) batches of the served candidate over ``split`` on the normalized scale."""
        if self.model is None:
            return anchor_batches(client, self.which, split) or []
        return forecasts(self.model, split_windows(client, split))

    def metrics(self, client: ClientData, split: str) -> Metrics:
        """The served candidate's metrics over ``split``."""
        levels = None if self.model is None else self.model.levels
        return forecast_metrics(self.batches(client, split), levels, None, split_windows(client, split).scale)


def choose(scores: dict[str, float]) -> str:
    """The candidate with the lowest finite score, the first listed on a tie or when none has a
    finite score (a diverged model is still what a gateway with nothing else serves)."""
    if not scores:
        raise ValueError("choose: no candidates")
    finite = {name: score for name, score in scores.items() if math.isfinite(score)}
    return min(finite, key=finite.__getitem__) if finite else next(iter(scores))


def anchor_scores(client: ClientData, names: Sequence[str]) -> dict[str, float]:
    """Each named anchor's validation score on the client (NaN where its history is too short)."""
    scores = {}
    for name in names:
        metrics = anchor_metrics(client, name, "val")
        scores[name] = math.nan if metrics is None else metrics.score
    return scores


def best_anchor(client: ClientData, names: Sequence[str]) -> Served:
    """The anchor a gateway serves when it has nothing learned to serve."""
    scores = anchor_scores(client, names)
    return Served(choose(scores), None, scores)



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
