"""The one rule that picks what a gateway serves, on plain arrays (no torch): each candidate's
mean per-window score over the windows whose outcome is known at a moment, each window weighted
by its age, the weight halving every ``selection_days`` days (an exponentially weighted mean);
lowest wins. Recent outcomes count most, because which candidate wins moves with the seasons, and
older ones still count, so the choice does not chase the luck of the latest two weeks (a hard
14-day window did: ``bench/selection.py`` measured the rules on the development data, where this
one met the verdict in the most cells of the half of the test days it was chosen on).
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


def recent_score(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, half_life: int | None) -> float:
    """Mean of the per-window ``scores`` over the windows scored (finite) whose outcome is known at
    row ``at`` (origin + horizon <= at), each weighted ``0.5 ** ((at - origin) / half_life)``
    (None: all alike); NaN where there is none."""
    known = np.isfinite(scores) & (origins + horizon <= at)
    if not known.any():
        return math.nan
    weights = None if half_life is None else 0.5 ** ((at - origins[known]) / half_life)
    return float(np.average(scores[known], weights=weights))


def choose_at(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, at: int,
              half_life: int | None) -> str:
    """The candidate a gateway serves from row ``at`` on, given every candidate's per-window scores
    (``errors``, windows at ``origins``, NaN where a candidate has none) and the half-life of a
    window's weight in rows (``half_life``; None: every known window alike)."""
    return choose({name: recent_score(e, origins, horizon, at, half_life) for name, e in errors.items()})


def daily_picks(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, period: int,
                served: np.ndarray, half_life: int | None) -> np.ndarray:
    """Which candidate serves each origin of ``served`` when the gateway re-chooses once a day
    (``period`` rows), at the first served origin and every day after it, by ``choose_at`` over
    the windows known by then (the served windows' own outcomes included, once past)."""
    picks = np.empty(len(served), dtype=object)
    if not len(served):
        return picks
    first = int(served.min())
    days = (served - first) // period
    for day in np.unique(days):
        picks[days == day] = choose_at(errors, origins, horizon, first + int(day) * period, half_life)
    return picks
