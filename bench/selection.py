"""Which rule should a gateway use to choose what it serves? Measured on saved per-window errors.

``bench/value.py --windows FILE.npz`` keeps every run's per-window errors (validation and test);
this script re-plays the daily choice of ``served`` under other rules, without retraining, and
scores each rule as value.py scores the product's: the fleet's mean test MASE per (dataset, K),
and the worst gateway's excess over its own best anchor (the best in hindsight, on the test
windows). Rules (each re-chooses once a day on outcomes already known):

- ``latest_D``: the lowest mean MASE over the latest D days (0: every known window); the
  product's rule is ``latest_14`` (``edge_agent.selection``).
- ``sticky_M``: as ``latest_14``, but yesterday's choice is kept unless another candidate is
  better by more than M (relative): fewer switches on noise.
- ``anchor_first_M``: as ``latest_14``, but a learned candidate replaces the best anchor only when
  it is better by more than M: the burden of proof on the model.
- ``decay_H``: exponentially weighted mean MASE with a half-life of H days.
- ``proven_Z``: the best anchor unless the best learned candidate beats it over the latest 14 days
  by a one-sided Diebold-Mariano-style test on daily error differences (statistic above Z).

Which rule wins is decided on the first half of each gateway's test days and reported on the
second half too, so a rule is not picked by the windows it is judged on. Usage:

    python bench/value.py --quick --windows /tmp/w.npz     # once (the whole value bench)
    python bench/selection.py --windows /tmp/w.npz         # seconds; writes bench/results/selection.{json,md}
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common import ROOT, commit
from value import load_windows
from value_report import SERVED, SERVED_FEDERATED

from edge_agent.choice import choose, recent_score

Rule = Callable[[dict[str, np.ndarray], np.ndarray, int, int, int, str | None], str]
LEARNED = ("federated", "local", "median")


def latest(days: int) -> Rule:
    """The lowest mean score over the latest ``days`` days of known outcomes (0: all of them)."""
    def rule(errors, origins, horizon, at, period, previous):
        span = days * period if days else None
        return choose({name: recent_score(e, origins, horizon, at, span) for name, e in errors.items()})
    return rule


def sticky(margin: float) -> Rule:
    """``latest(14)``, keeping yesterday's choice unless another is better by more than ``margin``."""
    def rule(errors, origins, horizon, at, period, previous):
        scores = {name: recent_score(e, origins, horizon, at, 14 * period) for name, e in errors.items()}
        best = choose(scores)
        if previous is not None and math.isfinite(scores.get(previous, math.nan)):
            return best if scores[best] < (1 - margin) * scores[previous] else previous
        return best
    return rule


def anchor_first(margin: float) -> Rule:
    """``latest(14)``, serving a learned candidate only when it beats the best anchor by ``margin``."""
    def rule(errors, origins, horizon, at, period, previous):
        scores = {name: recent_score(e, origins, horizon, at, 14 * period) for name, e in errors.items()}
        anchors = {n: s for n, s in scores.items() if n not in LEARNED}
        learned = {n: s for n, s in scores.items() if n in LEARNED}
        best_anchor, best_learned = choose(anchors), choose(learned)
        return best_learned if scores[best_learned] < (1 - margin) * scores[best_anchor] else best_anchor
    return rule


def decay(half_life_days: float) -> Rule:
    """The lowest exponentially weighted mean score, weights halving every ``half_life_days``."""
    def rule(errors, origins, horizon, at, period, previous):
        known = origins + horizon <= at
        weights = 0.5 ** ((at - origins[known]) / (half_life_days * period))
        return choose({name: float(np.average(e[known], weights=weights)) if known.any() else math.nan
                       for name, e in errors.items()})
    return rule


def proven(z: float) -> Rule:
    """The best anchor over the latest 14 days, unless the best learned candidate beats it there by
    a one-sided Diebold-Mariano-style test (Diebold & Mariano 1995): the mean of the daily mean
    error differences over its standard error exceeds ``z``. Days, not windows, are the samples:
    windows of one day overlap in their outcomes."""
    def rule(errors, origins, horizon, at, period, previous):
        span = 14 * period
        scores = {name: recent_score(e, origins, horizon, at, span) for name, e in errors.items()}
        anchors = {n: v for n, v in scores.items() if n not in LEARNED}
        learned = {n: v for n, v in scores.items() if n in LEARNED}
        best_anchor, best_learned = choose(anchors), choose(learned)
        known = (origins + horizon <= at) & (origins >= at - span)
        days = (origins[known] - origins[known].min()) // period if known.any() else np.zeros(0, int)
        gaps = errors[best_anchor][known] - errors[best_learned][known]
        daily = np.array([gaps[days == d].mean() for d in np.unique(days)])
        if len(daily) < 3 or not np.isfinite(daily).all() or daily.std(ddof=1) == 0:
            return best_anchor
        return best_learned if daily.mean() / (daily.std(ddof=1) / math.sqrt(len(daily))) > z else best_anchor
    return rule


RULES: dict[str, Rule] = {
    "latest_7": latest(7), "latest_14": latest(14), "latest_28": latest(28), "latest_0": latest(0),
    "sticky_2": sticky(0.02), "sticky_5": sticky(0.05),
    "anchor_first_2": anchor_first(0.02), "anchor_first_5": anchor_first(0.05),
    "decay_7": decay(7), "decay_14": decay(14), "proven_1.0": proven(1.0), "proven_1.645": proven(1.645),
}


def replay(candidates: dict[str, dict], rule: Rule) -> np.ndarray:
    """Per test window, the test MASE of what ``rule`` serves, re-chosen once a day."""
    first = next(iter(candidates.values()))["windows"]
    horizon, period, test_origins = first["horizon"], first["period"], first["test_origins"]
    origins = np.concatenate([first["val_origins"], test_origins])
    errors = {name: np.concatenate([c["windows"]["val"], c["windows"]["test"]["mase"]]) for name, c in candidates.items()}
    days = (test_origins - test_origins[0]) // period
    served, previous = np.empty(len(test_origins)), None
    for day in np.unique(days):
        previous = rule(errors, origins, horizon, int(test_origins[0] + day * period), period, previous)
        served[days == day] = candidates[previous]["windows"]["test"]["mase"][days == day]
    return served


def cells(runs: list[dict]) -> dict[tuple, list[dict[str, dict[str, dict]]]]:
    """Per (dataset, K): per seed, per gateway, its candidates' saved scores (as value.served_runs)."""
    anchors = [r for r in runs if r["backbone"] is None]
    out: dict[tuple, list] = {}
    for r in runs:
        if r["method"] != SERVED_FEDERATED:
            continue
        key = (r["dataset"], r["history_days"], r["backbone"], r["seed"])
        same = {x["method"]: x for x in runs if (x["dataset"], x["history_days"], x["backbone"], x["seed"]) == key}
        pool = {"federated": r, "local": same["local"],  # value.served_runs' order, which breaks ties
                **{a["method"]: a for a in anchors if (a["dataset"], a["history_days"]) == key[:2]},
                **({"median": same["median"]} if "median" in same else {})}
        out.setdefault(key[:2], []).append({client: {n: run["clients"][client] for n, run in pool.items()}
                                            for client in r["clients"]})
    return out


def score_rule(seeds: list[dict[str, dict[str, dict]]], rule: Rule, half: str) -> dict:
    """A rule's fleet mean MASE (mean over seeds) and worst gateway excess over its own best anchor
    (hindsight, same test windows), on the ``half`` ("first", "second", "all") of the test days."""
    means, worst = [], -math.inf
    for gateways in seeds:
        per_gateway = []
        for candidates in gateways.values():
            served = replay(candidates, rule)
            part = test_part(candidates, half)
            anchor = min(float(np.mean(c["windows"]["test"]["mase"][part])) for n, c in candidates.items()
                         if n not in LEARNED)
            per_gateway.append(float(np.mean(served[part])))
            worst = max(worst, per_gateway[-1] / anchor - 1)
        means.append(float(np.mean(per_gateway)))
    return {"mase": float(np.mean(means)), "worst_client_vs_best_anchor": worst}


def test_part(candidates: dict[str, dict], half: str) -> np.ndarray:
    """A mask of the test windows in the ``half`` of the test days."""
    first = next(iter(candidates.values()))["windows"]
    days = (first["test_origins"] - first["test_origins"][0]) // first["period"]
    middle = days.max() / 2
    return {"first": days < middle, "second": days >= middle, "all": np.ones(len(days), bool)}[half]


def study(runs: list[dict]) -> list[dict]:
    """Every rule on every (dataset, K) cell, on each half of the test days and on all of them."""
    rows = []
    for (dataset, days), seeds in sorted(cells(runs).items(), key=lambda kv: (kv[0][0], kv[0][1] or 10**6)):
        for name, rule in RULES.items():
            rows.append({"dataset": dataset, "history_days": days, "rule": name,
                         **{half: score_rule(seeds, rule, half) for half in ("first", "second", "all")}})
    return rows


def markdown(rows: list[dict]) -> str:
    """Per rule: the cells it meets (served within 2% of every gateway's best anchor), and its mean
    MASE relative to the product's rule, on each half."""
    base = {(r["dataset"], r["history_days"], h): r[h]["mase"] for r in rows if r["rule"] == "latest_14"
            for h in ("first", "second", "all")}
    lines = ["| rule | cells met (first / second / all) | MASE vs latest_14 (first / second / all) |", "|---|---|---|"]
    for name in RULES:
        mine = [r for r in rows if r["rule"] == name]
        met = [sum(r[h]["worst_client_vs_best_anchor"] <= 0.02 for r in mine) for h in ("first", "second", "all")]
        ratio = [np.mean([r[h]["mase"] / base[r["dataset"], r["history_days"], h] for r in mine]) - 1
                 for h in ("first", "second", "all")]
        lines.append(f"| {name} | {' / '.join(f'{m}/{len(mine)}' for m in met)} | "
                     f"{' / '.join(f'{x:+.2%}' for x in ratio)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--windows", type=Path, required=True, help="the .npz bench/value.py --windows wrote")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    runs, value_config = load_windows(args.windows)
    runs = [r for r in runs if r["method"] != SERVED]
    rows = study(runs)
    table = markdown(rows)
    result = {"rows": rows, "config": {"rules": list(RULES), "commit": commit(),
                                       "value_run": {k: value_config.get(k) for k in ("commit", "mode", "seeds")}}}
    (args.out / "selection.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "selection.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
