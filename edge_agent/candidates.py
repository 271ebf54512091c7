"""How a gateway reports what it serves, in the metrics of its updates (plain names and floats, no
torch: the coordinator's status and the serving process read them): ``val.<candidate>`` is each
candidate's validation score, ``serving.<candidate>`` = 1 the one it serves
(``edge_agent.selection``)."""

from __future__ import annotations

SERVING_PREFIX, VALIDATION_PREFIX = "serving.", "val."


def served_name(metrics: dict[str, float]) -> str | None:
    """Which candidate a gateway says it serves (its ``serving.<name>`` metric), None if it does not say."""
    names = [key[len(SERVING_PREFIX):] for key, value in metrics.items() if key.startswith(SERVING_PREFIX) and value]
    return names[0] if len(names) == 1 else None


def validation_scores(metrics: dict[str, float]) -> dict[str, float]:
    """Every candidate's validation score a gateway reported (``val.<name>``), by candidate."""
    return {key[len(VALIDATION_PREFIX):]: value for key, value in metrics.items() if key.startswith(VALIDATION_PREFIX)}
