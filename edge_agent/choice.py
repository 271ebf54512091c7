"""The one rule that picks what a gateway serves, on plain arrays (no torch). A gateway holds the
candidate with the lowest mean per-window score over every window whose outcome it knows (at the
first test day: the one its validation split picks) and moves to the candidate that is best over
its latest windows only when that one beats it there by a one-sided Diebold-Mariano-style test on
daily mean score differences (Diebold & Mariano 1995): the lowest of many noisy two-week means is
chosen for its luck as much as for its skill (the winner's curse), so recent errors move the
choice only with evidence (``bench/selection.py`` measured the rules on the development data).
The live agent applies it at its present (``edge_agent.selection.select``); ``simulate`` and every
benchmark apply it once a day through the test split (``daily_picks``), so a benchmark measures
what a gateway does (README, "Does joining the fleet pay?")."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from edge_agent.recipe import SELECTION_EVIDENCE


def choose(scores: Mapping[str, float]) -> str:
    """The candidate with the lowest finite score, the first listed on a tie or when none has a
    finite score (a diverged model is still what a gateway with nothing else serves)."""
    if not scores:
        raise ValueError("choose: no candidates")
    finite = {name: score for name, score in scores.items() if math.isfinite(score)}
    return min(finite, key=finite.__getitem__) if finite else next(iter(scores))


def known_windows(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, span: int | None) -> np.ndarray:
    """Which windows a choice at row ``at`` may read: scored (finite), outcome known by then
    (origin + horizon <= at) and started at most ``span`` rows before it (None: any)."""
    known = np.isfinite(scores) & (origins + horizon <= at)
    return known & (origins >= at - span) if span is not None else known


def recent_score(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, span: int | None) -> float:
    """Mean of the per-window ``scores`` over the windows a choice at row ``at`` may read
    (``known_windows``); NaN where there is none."""
    known = known_windows(scores, origins, horizon, at, span)
    return float(scores[known].mean()) if known.any() else math.nan


def evidence(challenger: np.ndarray, default: np.ndarray, origins: np.ndarray, horizon: int, at: int, span: int,
             period: int) -> float:
    """How strongly ``challenger`` beats ``default`` over the latest ``span`` rows of windows both
    scored: the mean of their daily mean score differences over its standard error (days are the
    samples, since one day's windows share outcomes); -inf with fewer than three days or no spread."""
    gaps = default - challenger
    known = known_windows(gaps, origins, horizon, at, span)
    days = (at - origins[known]) // period
    daily = np.array([gaps[known][days == day].mean() for day in np.unique(days)])
    if len(daily) < 3 or daily.std(ddof=1) == 0:
        return -math.inf
    return float(daily.mean() / (daily.std(ddof=1) / math.sqrt(len(daily))))


def choose_at(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, at: int, span: int | None,
              period: int, threshold: float = SELECTION_EVIDENCE) -> str:
    """The candidate a gateway serves from row ``at`` on, given every candidate's per-window scores
    (``errors``, windows at ``origins``, NaN where a candidate has none), its latest ``span`` rows
    (None: no recent window, the long-run best serves), its rows per day (``period``) and the
    ``evidence`` a recent best needs to replace the long-run best (``threshold``)."""
    default = choose({name: recent_score(e, origins, horizon, at, None) for name, e in errors.items()})
    if span is None:
        return default
    challenger = choose({name: recent_score(e, origins, horizon, at, span) for name, e in errors.items()})
    if challenger == default:
        return default
    strength = evidence(errors[challenger], errors[default], origins, horizon, at, span, period)
    return challenger if strength > threshold else default


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
        picks[days == day] = choose_at(errors, origins, horizon, first + int(day) * period, span, period)
    return picks
