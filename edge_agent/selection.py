"""What a gateway serves: the best of everything it can make, chosen on its own validation windows.

The candidates are its federated model, its local-only model (``keep_local``), the anchors
(``edge_agent.anchors``) it is allowed to serve, fitted on its own history, and the median of its
models and anchors (``median``; ``edge_agent.models.combination``). Each is scored on the
same windows and scale (``Metrics.score`` per window: MASE for point forecasts) over the
windows whose outcome is known, each weighted by its age, halving every ``selection_days`` days
(0: all alike), and the lowest wins, or with ``combine`` the mean of that many lowest is served
(``edge_agent.choice``; a tie goes to the candidate listed first: federated, local, the anchors in
order, the median). Recent errors count most, because
which candidate wins moves with the seasons: on the homes the validation months (Sep-Oct) favour
other candidates than the test weeks (Nov-Dec); older ones still count, because the lowest of
eight noisy two-week means is as often luck as skill (README, "Does joining the fleet pay?"). This extends FedPer's personalization with the oldest rule of forecasting
practice: never serve a model that loses to what the data's own seasonality gives for free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from edge_agent.anchors import fitted_forecasts, lookback_rule
from edge_agent.candidates import MEAN_OF_BEST, MEDIAN  # MEDIAN: the candidate that combines the others
from edge_agent.choice import choose_at, daily_picks, recent_score
from edge_agent.data import ClientData, WindowSet
from edge_agent.metrics import pinball_terms
from edge_agent.models import Forecaster
from edge_agent.models.combination import median_forecast
from edge_agent.models.seasonal import LookbackAnchor
from edge_agent.scoring import Scale, scaled_errors
from edge_agent.train import Batch, Metrics, forecast_metrics, forecasts

SPLITS = ("train", "val", "test")
KNOWN_SPLITS = ("val", "test")  # the windows whose outcomes a choice may read, each once known


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
    """What one gateway serves: ``which`` candidate ("federated", "local", an anchor's name,
    "median" or ``MEAN_OF_BEST``), its model (None for an anchor and the median), every candidate's score at the
    moment of the choice (NaN: not available), for the median its members by name (a model, None
    for an anchor) and, to re-choose later with the same rule, every ``candidates`` by name with
    ``median`` (whether the median competes) and the ``half_life`` of a window's weight in rows
    (``half_life_rows``; empty ``candidates``: the choice is fixed), with the per-window scores it
    already computed by split (``errors``), so a re-choice computes only the rest. ``picks`` are
    the candidates whose mean is served, best first (``which`` is ``MEAN_OF_BEST`` where there are
    several), ``combine`` how many a re-choice takes (``edge_agent.choice.choose_at``)."""

    which: str
    model: Forecaster | None
    scores: dict[str, float] = field(default_factory=dict)
    members: dict[str, nn.Module | None] = field(default_factory=dict)
    candidates: dict[str, nn.Module | None] = field(default_factory=dict)
    median: bool = False
    half_life: int | None = None
    errors: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    picks: tuple[str, ...] = ()
    combine: int = 1

    @property
    def is_anchor(self) -> bool:
        return self.model is None and self.which not in (MEDIAN, MEAN_OF_BEST)

    @property
    def label(self) -> str:
        """What is served, for people: a candidate's name, or ``a + b`` for the mean of several."""
        return " + ".join(self.picks) if len(self.picks) > 1 else self.which

    @property
    def levels(self) -> tuple[float, ...] | None:
        """The quantile levels of what is served: those of its model or of a quantile candidate
        (an anchor's point forecasts then serve every level alike); None for point forecasts."""
        models = [self.model, *self.candidates.values()]
        return next((m.levels for m in models if isinstance(m, Forecaster) and m.levels), None)

    def batches(self, client: ClientData, split: str) -> list[Batch]:
        """(forecast, target) batches of what is served over ``split`` on the normalized scale: on
        the test split re-chosen once a day as outcomes come in (``served_days``) where the
        candidates are known, else the candidate chosen."""
        if split == "test" and self.candidates:
            return served_days(client, self)[0]
        return self.current_batches(client, split)

    def current_batches(self, client: ClientData, split: str) -> list[Batch]:
        """(forecast, target) batches over ``split`` of what is served at the choice, not re-chosen."""
        if len(self.picks) > 1:
            return mean_batches([fixed_batches(client, name, self.candidates.get(name), self.candidates, split)
                                 for name in self.picks])
        return fixed_batches(client, self.which, self.model, self.members, split)

    def metrics(self, client: ClientData, split: str) -> Metrics:
        """The served forecasts' metrics over ``split``."""
        return forecast_metrics(self.batches(client, split), self.levels, None, split_windows(client, split).scale)


def fixed_batches(client: ClientData, which: str, model: nn.Module | None, members: dict[str, nn.Module | None],
                  split: str) -> list[Batch]:
    """Batches of one candidate (``which``: a model, an anchor, or the median of ``members``)."""
    if which == MEDIAN:
        return median_batches([candidate_batches(client, name, member, split) for name, member in members.items()])
    return candidate_batches(client, which, model, split) or []


def candidate_batches(client: ClientData, name: str, model: nn.Module | None, split: str) -> list[Batch] | None:
    """A model's (``model``) or an anchor's (``name``) batches over ``split`` (None: an anchor
    with too little history)."""
    if model is None:
        return anchor_batches(client, name, split)
    return list(forecasts(model, split_windows(client, split)))


def mean_batches(members: Sequence[list[Batch]]) -> list[Batch]:
    """One batch: the mean of the members' forecasts and the target (the combination of the best
    few a gateway serves; ``select``'s ``combine``)."""
    forecast = torch.stack([torch.cat([f for f, _ in batches]) for batches in members]).mean(dim=0)
    return [(forecast, torch.cat([y for _, y in members[0]]))]


def median_batches(members: Sequence[list[Batch] | None]) -> list[Batch]:
    """One batch: the median of the members' forecasts (those that have any) and the target."""
    present = [batches for batches in members if batches]
    forecast = median_forecast(torch.stack([torch.cat([f for f, _ in batches]) for batches in present]))
    return [(forecast, torch.cat([y for _, y in present[0]]))]


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


def half_life_rows(client: ClientData, selection_days: int) -> int | None:
    """``selection_days``, the half-life of a window's weight in the choice, in rows of the
    client's data (None: 0 days, every window alike)."""
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
           selection_days: int = 0, at: int | None = None, combine: int = 1) -> Served:
    """What the gateway serves at row ``at`` of its data (None: the first test origin, what a
    benchmark knows before it scores the test split; a live gateway passes ``present``): among
    ``models``, the ``anchors`` and (with ``median``, point models and at least three members) the
    median of them all, the candidate with the lowest score over the windows whose outcome is
    known by then, each weighted by its age, halving every ``selection_days`` days (0: all alike;
    ``edge_agent.choice``), or with ``combine`` > 1 (point forecasts) the mean of that many best."""
    fitted = [name for name in anchors if anchor_forecasts(client, name, "val") is not None]
    members: dict[str, nn.Module | None] = {**models, **dict.fromkeys(fitted)}
    clock = first_test_origin(client) if at is None else at
    horizon = client.val.horizon
    known = [split for split in KNOWN_SPLITS if (split_windows(client, split).origins() + horizon <= clock).any()]
    errors = {split: split_scores(client, members, median, split) for split in known}
    half_life = half_life_rows(client, selection_days)
    scores = dict.fromkeys([*models, *anchors], math.nan)
    count = 1 if is_quantile(members) else combine
    picks = (next(iter(scores)),)
    if known:
        origins = np.concatenate([split_windows(client, split).origins() for split in known])
        history = {name: np.concatenate([errors[split][name] for split in known]) for name in errors[known[0]]}
        scores |= {name: recent_score(e, origins, horizon, clock, half_life) for name, e in history.items()}
        picks = choose_at(history, origins, horizon, clock, half_life, count)
    competes = MEDIAN in errors.get(known[0], {}) if known else median_competes(members, median)
    which = picks[0] if len(picks) == 1 else MEAN_OF_BEST
    return Served(which, models.get(which), scores, members if MEDIAN in picks else {}, members, competes, half_life,
                  errors, picks, count)


def is_quantile(members: dict[str, nn.Module | None]) -> bool:
    """Whether any member forecasts quantiles (then nothing is combined: a quantile model has its own median)."""
    return any(isinstance(model, Forecaster) and model.levels for model in members.values())


def median_competes(members: dict[str, nn.Module | None], median: bool) -> bool:
    """Whether the median is a candidate: asked for, point models only, at least three members."""
    return median and len(members) >= 3 and not is_quantile(members)


def split_scores(client: ClientData, members: dict[str, nn.Module | None], median: bool, split: str
                 ) -> dict[str, np.ndarray]:
    """Every candidate's per-window score over the windows of ``split`` (NaN where an anchor has no
    forecast), the median's too where it competes (``median_competes``): what the rule of
    ``edge_agent.choice`` reads."""
    windows = split_windows(client, split)
    batches = {name: candidate_batches(client, name, model, split) for name, model in members.items()}
    errors = {name: np.full(len(windows), math.nan) if b is None else
              window_scores(b, getattr(members[name], "levels", None), windows.scale) for name, b in batches.items()}
    if median_competes(members, median):
        errors[MEDIAN] = window_scores(median_batches(list(batches.values())), None, windows.scale)
    return errors


def first_test_origin(client: ClientData) -> int:
    """The row of the client's first test forecast: the clock of a choice made before the test."""
    origins = client.test.origins()
    return int(origins.min()) if len(origins) else int(client.val.origins().max()) + client.val.horizon


def present(client: ClientData) -> int:
    """The clock of a live gateway: every outcome in its data is known."""
    return len(client.raw)


def served_days(client: ClientData, served: Served) -> tuple[list[Batch], list[tuple[str, ...]]]:
    """What the gateway serves over its test windows when it re-chooses once a day as outcomes come
    in (``edge_agent.choice.daily_picks``, the rule of ``select`` at the start of each day): the
    served (forecast, target) batch and which candidates made each window's forecast (their mean)."""
    members = served.candidates
    errors = {split: served.errors.get(split) or split_scores(client, members, served.median, split)
              for split in KNOWN_SPLITS}
    origins = np.concatenate([split_windows(client, split).origins() for split in KNOWN_SPLITS])
    history = {name: np.concatenate([errors[split][name] for split in KNOWN_SPLITS]) for name in errors["val"]}
    test = client.test
    picks = daily_picks(history, origins, test.horizon, client.period, test.origins(), served.half_life,
                        served.combine)
    forecasts = {name: with_levels(torch.cat([f for f, _ in fixed_batches(client, name, members.get(name), members,
                                                                           "test")]), served.levels)
                 for name in {name for pick in picks for name in pick}}
    rows = [torch.stack([forecasts[name][j] for name in pick]).mean(dim=0) for j, pick in enumerate(picks)]
    return [(torch.stack(rows) if rows else torch.zeros((0,)), test.targets())], picks


def with_levels(forecast: torch.Tensor, levels: Sequence[float] | None) -> torch.Tensor:
    """A point forecast (N, H, F) as every quantile level alike (N, H, F, Q) when what is served
    has ``levels``; a quantile forecast or a point forecast of a point fleet as it is."""
    if levels is None or forecast.dim() == 4:
        return forecast
    return forecast.unsqueeze(-1).expand(*forecast.shape, len(levels))


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
