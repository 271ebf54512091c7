"""How a gateway reports what it serves, in the metrics of its updates (plain names and floats, no
torch: the coordinator's status and the serving process read them): ``val.<candidate>`` is each
candidate's validation score, ``serving.<candidate>`` its share of the served forecast (1: it
alone; ``1/k`` each of the ``k`` best whose mean is served; ``edge_agent.selection``)."""

from __future__ import annotations

import math
from statistics import fmean

SERVING_PREFIX, VALIDATION_PREFIX = "serving.", "val."
FEDERATED, LOCAL, MEDIAN = "federated", "local", "median"  # the candidates that are not anchors
MEAN_OF_BEST = "mean_of_best"  # what is served when it is the mean of several candidates (``combine``)


def served_picks(metrics: dict[str, float]) -> list[str]:
    """The candidates a gateway says it serves (its ``serving.<name>`` metrics), in the order it sent them."""
    return [key[len(SERVING_PREFIX):] for key, value in metrics.items() if key.startswith(SERVING_PREFIX) and value]


def served_name(metrics: dict[str, float]) -> str | None:
    """What a gateway says it serves: a candidate, ``a + b`` for the mean of several, None if it does not say."""
    return " + ".join(served_picks(metrics)) or None


def validation_scores(metrics: dict[str, float]) -> dict[str, float]:
    """Every candidate's validation score a gateway reported (``val.<name>``), by candidate."""
    return {key[len(VALIDATION_PREFIX):]: value for key, value in metrics.items() if key.startswith(VALIDATION_PREFIX)}


def quality(metrics: dict[str, float]) -> dict[str, str | float | None] | None:
    """What a gateway serves and how it validates beside the free forecasts: the served candidate
    and its score (for the mean of several, the mean of theirs: a bound the mean's own MAE never
    exceeds), the federated model's, and the best anchor's (name and score; the lowest of its
    anchors); None where it reports no validation scores."""
    scores = {name: score for name, score in validation_scores(metrics).items() if math.isfinite(score)}
    if not scores:
        return None
    anchors = {name: score for name, score in scores.items() if name not in (FEDERATED, LOCAL, MEDIAN)}
    best = min(anchors, key=anchors.__getitem__) if anchors else None
    picks = served_picks(metrics)
    served = [scores[name] for name in picks if name in scores]
    return {"serves": served_name(metrics), "served": fmean(served) if picks and len(served) == len(picks) else None,
            "federated": scores.get(FEDERATED), "best_anchor": best, "anchor": anchors.get(best) if best else None}


def fleet_quality(reports: list[dict[str, float]]) -> dict[str, float | None]:
    """The fleet's mean validation score of what its gateways serve, of the federated model and of
    each gateway's best anchor, over the gateways that report each (``quality``)."""
    rows = [row for row in map(quality, reports) if row is not None]
    return {key: (fmean(values) if values else None)
            for key in ("served", "federated", "anchor")
            for values in [[row[key] for row in rows if row[key] is not None]]}
