"""The one rule that picks what a gateway serves, on plain arrays (no torch): each candidate's
mean per-window score over the latest windows whose outcome is known at a moment, lowest wins.
The live agent applies it at its present (``edge_agent.selection.select``); ``simulate`` and every
benchmark apply it once a day through the test split (``daily_picks``), so a benchmark measures
what a gateway does (README, "Does joining the fleet pay?")."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def choose(scores: Mapping[str, float]) -> str:
    """The candidate with the lowest finite score, the first listed on a tie or when none has a
    finite score (a diverged model is still what a gateway with nothing else serves)."""
    if not scores:
        raise ValueError("choose: no candidates")
    finite = {name: score for name, score in scores.items() if math.isfinite(score)}
    return min(finite, key=finite.__getitem__) if finite else next(iter(scores))


def recent_score(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, span: int | None) -> float:
    """Mean of the per-window ``scores`` over the windows whose outcome is known at row ``at``
    (origin + horizon <= at) and that start at most ``span`` rows before it (None: all known);
    NaN where there is none."""
    known = origins + horizon <= at
    if span is not None:
        known &= origins >= at - span
    return float(scores[known].mean()) if known.any() else math.nan


def choose_at(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, at: int,
              span: int | None) -> str:
    """The candidate a gateway serves from row ``at`` on, given every candidate's per-window scores
    (``errors``, windows at ``origins``) and the rows it looks back on (``span``; None: all)."""
    return choose({name: recent_score(e, origins, horizon, at, span) for name, e in errors.items()})


def daily_picks(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, period: int,
                served: np.ndarray, span: int | None) -> np.ndarray:
    """Which candidate serves each origin of ``served`` when the gateway re-chooses once a day
    (``period`` rows), at the first served origin and every day after it, by ``choose_at`` over
    the windows known by then (the served windows' own outcomes included, once past)."""
    picks = np.empty(len(served), dtype=object)
    if not len(served):
        return picks
    first = int(served.min())
    days = (served - first) // period
    for day in np.unique(days):
        picks[days == day] = choose_at(errors, origins, horizon, first + int(day) * period, span)
    return picks
