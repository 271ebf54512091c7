"""The one rule that picks what a gateway serves, on plain arrays (no torch): each candidate's
mean per-window score over the windows whose outcome is known at a moment, each window weighted
by its age, the weight halving every ``selection_days`` days (an exponentially weighted mean);
the ``combine`` lowest are served, as the mean of their forecasts. Recent outcomes count most,
because which candidate wins moves with the seasons, and older ones still count, so the choice
does not chase the luck of the latest two weeks (a hard 14-day window did: ``bench/selection.py``
measured the rules on the development data, where this one met the verdict in the most cells of
the half of the test days it was chosen on). Serving the mean of the best two rather than the best
alone (the recipe's ``combine``) takes the sting out of the winner's curse: among near-equal
candidates, the one that scored lowest lately is as often lucky as good, and a daily choice among
them lost to each on sealed data; a mean of two forecasts is never worse than the worse of them
(MAE is convex) and on the development data met the verdict in more cells than the best alone
(README, "Does joining the fleet pay?"). Only near-equal candidates are combined: one whose score
is more than ``NEAR_BEST`` (5%) behind the best's joins no mean, so a clear winner serves alone
(on the development data, ``bench/combination.py``, the mean of two within 5% met the verdict in as
many cells as the plain mean of two in every part of the test days, at a lower fleet MASE in each).
The live agent applies it at its present (``edge_agent.selection.select``); ``simulate`` and every
benchmark apply it once a day through the test split (``daily_picks``), so a benchmark measures
what a gateway does (README, "Does joining the fleet pay?")."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

NEAR_BEST = 0.05  # how far (relative) behind the best's score a candidate may be and still join the mean


def best(scores: Mapping[str, float], count: int = 1, within: float | None = NEAR_BEST) -> tuple[str, ...]:
    """The ``count`` candidates with the lowest finite scores, best first (a tie goes to the first
    listed), fewer where fewer have one or, with ``within``, where fewer score at most
    ``(1 + within)`` times the best's (None: any); the first listed alone when none has a score (a diverged
    model is still what a gateway with nothing else serves)."""
    if not scores:
        raise ValueError("choose: no candidates")
    if count < 1:
        raise ValueError(f"choose: count must be >= 1, got {count}")
    order = list(scores)
    finite = sorted((name for name, score in scores.items() if math.isfinite(score)),
                    key=lambda name: (scores[name], order.index(name)))
    if within is not None and finite:
        finite = [name for name in finite if scores[name] <= (1 + within) * scores[finite[0]]]
    return tuple(finite[:count]) or (order[0],)


def choose(scores: Mapping[str, float]) -> str:
    """The candidate with the lowest finite score (``best`` of one)."""
    return best(scores)[0]


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
              half_life: int | None, count: int = 1, within: float | None = NEAR_BEST) -> tuple[str, ...]:
    """The candidates whose forecasts a gateway serves (their mean) from row ``at`` on, best first,
    given every candidate's per-window scores (``errors``, windows at ``origins``, NaN where a
    candidate has none), the half-life of a window's weight in rows (``half_life``; None: every
    known window alike), how many it combines (``count``; 1: the best alone) and how near the
    best's score another's must be to join (``within``, relative; None: any)."""
    scores = {name: recent_score(e, origins, horizon, at, half_life) for name, e in errors.items()}
    return best(scores, count, within)


def daily_picks(errors: Mapping[str, np.ndarray], origins: np.ndarray, horizon: int, period: int,
                served: np.ndarray, half_life: int | None, count: int = 1) -> list[tuple[str, ...]]:
    """Which candidates serve each origin of ``served`` when the gateway re-chooses once a day
    (``period`` rows), at the first served origin and every day after it, by ``choose_at`` over
    the windows known by then (the served windows' own outcomes included, once past)."""
    if not len(served):
        return []
    first = int(served.min())
    days = (served - first) // period
    chosen = {int(day): choose_at(errors, origins, horizon, first + int(day) * period, half_life, count)
              for day in np.unique(days)}
    return [chosen[int(day)] for day in days]
