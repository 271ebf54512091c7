"""Which rule should a gateway use to choose what it serves? Measured on saved per-window errors.

``bench/value.py --windows FILE.npz`` keeps every run's per-window errors (validation and test);
this script re-plays the daily choice of ``served`` under other rules, without retraining, and
scores each rule as value.py scores the product's: the fleet's mean test MASE per (dataset, K),
the worst gateway's excess over its own best anchor (the best in hindsight, on the test windows)
and value.py's verdict (fleet at most the best anchor, 90% of gateways within 2% of the anchor
their validation picks, none over 10%). Rules (each re-chooses once a day on outcomes already
known):

- ``latest_D``: the lowest mean MASE over the latest D days (0: every known window); the
  product's rule was ``latest_14`` until ``decay_14`` replaced it.
- ``sticky_M``: as ``latest_14``, but yesterday's choice is kept unless another candidate is
  better by more than M (relative): fewer switches on noise.
- ``anchor_first_M``: as ``latest_14``, but a learned candidate replaces the best anchor only when
  it is better by more than M: the burden of proof on the model.
- ``decay_H``: exponentially weighted mean MASE with a half-life of H days; ``decay_14`` is the
  product's rule (``edge_agent.choice``, ``selection_days`` = 14).
- ``proven_Z``: the best anchor unless the best learned candidate beats it over the latest 14 days
  by a one-sided Diebold-Mariano-style test on daily error differences (statistic above Z).
- ``decay_margin_M``: ``decay_14``, but a learned winner (federated, local, median) serves only
  where it beats the best anchor under the same weighted mean by more than M (relative), else that
  anchor: the product's rule with the burden of proof on the models.
- ``decay_proven_Z``: ``decay_14``, but a learned winner serves only where it beats the best
  anchor (both under the weighted mean) by the one-sided test of ``proven_Z`` over the latest 14
  days, else that anchor.
- ``held_Z`` / ``held_anchor_Z``: the candidate (any / an anchor) with the lowest mean over every
  known window, the one the validation split picks on the first test day, unless the best
  candidate over the latest 14 days beats it there by that test (statistic above Z): recent
  errors still move the choice, but only with evidence (the winner's curse of choosing the lowest
  of many noisy 14-day means).

Which rule wins is decided on the first half of each gateway's test days and reported on the
second half too, so a rule is not picked by the windows it is judged on. Usage:

    python bench/value.py --quick --windows /tmp/w.npz     # once (the whole value bench)
    python bench/selection.py --windows /tmp/w.npz         # 15 min (25 rules); writes bench/results/selection.{json,md}
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

from edge_agent.choice import choose, choose_at, recent_score
from edge_agent.recipe import TRAINING

Rule = Callable[[dict[str, np.ndarray], np.ndarray, int, int, int, str | None], str]
LEARNED = ("federated", "local", "median")
HALVES = ("first", "second", "all")
PRODUCT = f"decay_{TRAINING['selection_days']}"  # the rule of edge_agent.choice at the recipe's half-life


def latest(days: int) -> Rule:
    """The lowest mean score over the latest ``days`` days of known outcomes (0: all of them)."""
    def rule(errors, origins, horizon, at, period, previous):
        return choose({name: latest_mean(e, origins, horizon, at, period, days) if days else
                       recent_score(e, origins, horizon, at, None) for name, e in errors.items()})
    return rule


def sticky(margin: float) -> Rule:
    """``latest(14)``, keeping yesterday's choice unless another is better by more than ``margin``."""
    def rule(errors, origins, horizon, at, period, previous):
        scores = {name: latest_mean(e, origins, horizon, at, period) for name, e in errors.items()}
        best = choose(scores)
        if previous is not None and math.isfinite(scores.get(previous, math.nan)):
            return best if scores[best] < (1 - margin) * scores[previous] else previous
        return best
    return rule


def anchor_first(margin: float) -> Rule:
    """``latest(14)``, serving a learned candidate only when it beats the best anchor by ``margin``."""
    def rule(errors, origins, horizon, at, period, previous):
        scores = {name: latest_mean(e, origins, horizon, at, period) for name, e in errors.items()}
        anchors = {n: s for n, s in scores.items() if n not in LEARNED}
        learned = {n: s for n, s in scores.items() if n in LEARNED}
        best_anchor, best_learned = choose(anchors), choose(learned)
        return best_learned if scores[best_learned] < (1 - margin) * scores[best_anchor] else best_anchor
    return rule


def decay(half_life_days: float) -> Rule:
    """The lowest exponentially weighted mean score, weights halving every ``half_life_days``: the
    product's rule (``edge_agent.choice.choose_at``) with that half-life."""
    def rule(errors, origins, horizon, at, period, previous):
        return choose_at(errors, origins, horizon, at, round(half_life_days * period))[0]
    return rule


def decay_guarded(accept: Callable[[dict[str, np.ndarray], str, str, np.ndarray, int, int, int, dict], bool]
                  ) -> Rule:
    """``decay(14)``, where a learned winner serves only if ``accept(errors, winner, best_anchor,
    origins, horizon, at, period, scores)`` says so, else the best anchor under the same weighted mean."""
    def rule(errors, origins, horizon, at, period, previous):
        half_life = TRAINING["selection_days"] * period
        scores = {name: recent_score(e, origins, horizon, at, half_life) for name, e in errors.items()}
        winner = choose(scores)
        anchors = {n: v for n, v in scores.items() if n not in LEARNED}
        if winner not in LEARNED or not anchors:
            return winner
        anchor = choose(anchors)
        return winner if accept(errors, winner, anchor, origins, horizon, at, period, scores) else anchor
    return rule


def decay_margin(margin: float) -> Rule:
    """``decay(14)``, a learned winner serving only where it beats the best anchor by more than ``margin``."""
    return decay_guarded(lambda errors, winner, anchor, origins, horizon, at, period, scores:
                         not math.isfinite(scores[anchor]) or scores[winner] < (1 - margin) * scores[anchor])


def decay_proven(z: float) -> Rule:
    """``decay(14)``, a learned winner serving only where it beats the best anchor with ``evidence`` above ``z``."""
    return decay_guarded(lambda errors, winner, anchor, origins, horizon, at, period, scores:
                         evidence(errors[winner], errors[anchor], origins, horizon, at, period) > z)


def evidence(challenger: np.ndarray, default: np.ndarray, origins: np.ndarray, horizon: int, at: int,
             period: int) -> float:
    """How strongly ``challenger`` beats ``default`` over the latest 14 days of known windows: the
    mean of their daily mean score differences over its standard error (a one-sided
    Diebold-Mariano-style statistic, Diebold & Mariano 1995; days are the samples, since one
    day's windows share outcomes); -inf with fewer than three days or no spread."""
    gaps = default - challenger
    known = (origins + horizon <= at) & (origins >= at - 14 * period)
    days = (at - origins[known]) // period
    daily = np.array([gaps[known][days == day].mean() for day in np.unique(days)])
    if len(daily) < 3 or not np.isfinite(daily).all() or daily.std(ddof=1) == 0:
        return -math.inf
    return float(daily.mean() / (daily.std(ddof=1) / math.sqrt(len(daily))))


def challenged(errors: dict[str, np.ndarray], default: str, challenger: str, z: float, origins: np.ndarray,
               horizon: int, at: int, period: int) -> str:
    """``challenger`` where it beats ``default`` with ``evidence`` above ``z``, else ``default``."""
    if challenger == default:
        return default
    strength = evidence(errors[challenger], errors[default], origins, horizon, at, period)
    return challenger if strength > z else default


def proven(z: float) -> Rule:
    """The best anchor over the latest 14 days, unless the best learned candidate there beats it
    with ``evidence`` above ``z``."""
    def rule(errors, origins, horizon, at, period, previous):
        scores = {name: latest_mean(e, origins, horizon, at, period) for name, e in errors.items()}
        anchor = choose({n: v for n, v in scores.items() if n not in LEARNED})
        learned = choose({n: v for n, v in scores.items() if n in LEARNED})
        return challenged(errors, anchor, learned, z, origins, horizon, at, period)
    return rule


def held(z: float, anchors_only: bool = False) -> Rule:
    """The lowest mean over every known window (among the anchors with ``anchors_only``), unless
    the best over the latest 14 days beats it there with ``evidence`` above ``z``."""
    def rule(errors, origins, horizon, at, period, previous):
        pool = {n: e for n, e in errors.items() if not anchors_only or n not in LEARNED}
        default = choose({n: recent_score(e, origins, horizon, at, None) for n, e in pool.items()})
        challenger = choose({n: latest_mean(e, origins, horizon, at, period) for n, e in errors.items()})
        return challenged(errors, default, challenger, z, origins, horizon, at, period)
    return rule


def latest_mean(scores: np.ndarray, origins: np.ndarray, horizon: int, at: int, period: int, days: int = 14) -> float:
    """The plain mean score over the latest ``days`` days of known windows (NaN: none): the
    product's unweighted mean (``recent_score``) of the windows since then."""
    return recent_score(np.where(origins >= at - days * period, scores, math.nan), origins, horizon, at, None)


RULES: dict[str, Rule] = {
    "latest_7": latest(7), "latest_14": latest(14), "latest_28": latest(28), "latest_0": latest(0),
    "sticky_2": sticky(0.02), "sticky_5": sticky(0.05),
    "anchor_first_2": anchor_first(0.02), "anchor_first_5": anchor_first(0.05),
    "decay_7": decay(7), "decay_14": decay(14), "proven_1.0": proven(1.0), "proven_1.645": proven(1.645),
    "decay_margin_2": decay_margin(0.02), "decay_margin_5": decay_margin(0.05),
    "decay_proven_0.5": decay_proven(0.5), "decay_proven_1.0": decay_proven(1.0),
    **{f"held_{z}": held(z) for z in (0.0, 0.5, 1.0, 1.645, 2.0)},
    **{f"held_anchor_{z}": held(z, anchors_only=True) for z in (0.5, 1.0, 1.645, 2.0)},
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
    """A rule's fleet mean MASE (mean over seeds) on the ``half`` ("first", "second", "all") of the
    test days, beside value.py's verdict on it: the best single anchor's fleet MASE (hindsight),
    the worst gateway's excess over its own best anchor (hindsight), the share of gateways within
    2% of the anchor their validation picks and the worst excess over it; ``met`` as value.py's."""
    means, worst, against_val, anchor_fleet = [], -math.inf, [], {}
    for gateways in seeds:
        per_gateway = []
        for candidates in gateways.values():
            served = replay(candidates, rule)
            part = test_part(candidates, half)
            tested = {n: float(np.mean(c["windows"]["test"]["mase"][part])) for n, c in candidates.items()
                      if n not in LEARNED}
            for name, score in tested.items():
                anchor_fleet.setdefault(name, []).append(score)
            val_pick = min(tested, key=lambda n: candidates[n]["val"])
            per_gateway.append(float(np.mean(served[part])))
            worst = max(worst, per_gateway[-1] / min(tested.values()) - 1)
            against_val.append(per_gateway[-1] / tested[val_pick] - 1)
        means.append(float(np.mean(per_gateway)))
    best_anchor = min(float(np.mean(v)) for v in anchor_fleet.values())
    mase, within, worst_val = float(np.mean(means)), float(np.mean(np.array(against_val) <= 0.02)), max(against_val)
    return {"mase": mase, "vs_best_anchor": mase / best_anchor - 1, "worst_client_vs_best_anchor": worst,
            "gateways_within_2pct": within, "worst_gateway_vs_val_anchor": worst_val,
            "met": mase <= best_anchor and within >= 0.9 and worst_val <= 0.10}


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
                         **{half: score_rule(seeds, rule, half) for half in HALVES}})
    return rows


def markdown(rows: list[dict]) -> str:
    """Per rule: the cells where value.py's verdict holds (fleet at most the best anchor, 90% of
    gateways within 2% of their validation's anchor, none over 10%), the worst gateway against
    that anchor, and its mean MASE relative to the product's rule, on each half."""
    base = {(r["dataset"], r["history_days"], h): r[h]["mase"] for r in rows if r["rule"] == PRODUCT
            for h in HALVES}
    lines = [f"| rule | cells met (first / second / all) | worst gateway vs its val anchor (all) | "
             f"MASE vs {PRODUCT} (first / second / all) |", "|---|---|---|---|"]
    for name in RULES:
        mine = [r for r in rows if r["rule"] == name]
        met = [sum(r[h]["met"] for r in mine) for h in HALVES]
        ratio = [np.mean([r[h]["mase"] / base[r["dataset"], r["history_days"], h] for r in mine]) - 1 for h in HALVES]
        worst = max(r["all"]["worst_gateway_vs_val_anchor"] for r in mine)
        lines.append(f"| {name} | {' / '.join(f'{m}/{len(mine)}' for m in met)} | {worst:+.1%} | "
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
