"""Serve the best candidate, or a combination of the best few? Measured on the development data.

The daily choice of one candidate among several near-equal ones loses to each of them in turn on
some sealed cells (the winner's curse: the lowest of several noisy recent scores is as often luck
as skill). Forecast combination is the standard remedy (Bates & Granger 1969; the M4 leaders).
This script trains ``bench/value.py --quick``'s development fleets (FedAvg and Local-only, seeds
1-3, every dataset and history) and scores, per gateway, what it would serve each test day under
the product's ranking (``edge_agent.choice.choose_at``, the decayed score of ``selection_days``)
with each combination rule: the best alone (``best1``, the product's rule before ``combine`` = 2),
the mean of the best 2, 3 or 4, the median of the best 3 or 5, and the mean of the best 2 (or 3)
where the others score within 5, 10 or 20% of the best (``mean2_near10``: a candidate clearly
behind the best joins no mean, so a near tie is shared and a clear winner serves alone). Each rule
is judged by value.py's verdict (fleet at most the best anchor, 90% of gateways within 2% of the
anchor their validation picks, none over 10%) on the first half of each gateway's test days,
where a rule is chosen, and on the second half and all of them. Usage:

    python bench/combination.py --quick    # about an hour on 2 cores; bench/results/combination.{json,md}
    python bench/combination.py --quick --report-only --runs /tmp/combination_runs.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from common import ROOT, run_config, run_parallel
import value
from value_report import SERVED, summarize, verdicts

RULES = {"best1": (1, "mean", None), "mean2": (2, "mean", None), "mean3": (3, "mean", None),
         "median3": (3, "median", None), "mean4": (4, "mean", None), "median5": (5, "median", None),
         "mean2_near5": (2, "mean", 0.05), "mean2_near10": (2, "mean", 0.10), "mean2_near20": (2, "mean", 0.20),
         "mean3_near10": (3, "mean", 0.10)}
HALVES = ("all", "first", "second")


def combined(stack, operator: str):
    """The mean or the median (numpy's: the mean of the two middle ones for an even count) over axis 0."""
    from edge_agent.models.combination import median_forecast

    return stack.mean(dim=0) if operator == "mean" else median_forecast(stack)


def rule_scores(client, forecasts: dict, errors: dict) -> tuple[dict, dict]:
    """Per rule, the gateway's served test MASE (all test days and each half) and which candidates
    served; per candidate, its test MASE on each half. ``forecasts``: test forecasts by name;
    ``errors``: (validation, test) per-window MASE by name."""
    import torch

    from edge_agent.choice import choose_at
    from edge_agent.selection import window_metrics

    names = list(forecasts)
    origins = np.concatenate([client.val.origins(), client.test.origins()])
    history = {name: np.concatenate(errors[name]) for name in names}
    test = client.test.origins()
    days = (test - test.min()) // client.period
    first = days < (days.max() + 1) / 2
    half_life = value.SELECTION_DAYS * client.period
    out = {}
    for rule, (count, operator, within) in RULES.items():
        rows = torch.empty_like(forecasts[names[0]])
        served: dict[str, float] = {}
        for day in np.unique(days):
            picks = choose_at(history, origins, client.test.horizon, int(test.min()) + int(day) * client.period,
                              half_life, count, within)
            rows[days == day] = combined(torch.stack([forecasts[name][days == day] for name in picks]), operator)
            for name in picks:
                served[name] = served.get(name, 0.0) + float((days == day).sum()) / len(picks)
        metrics = window_metrics([(rows, client.test.targets())], client.test.scale)
        mase = metrics["mase"]
        out[rule] = {"mase": float(mase.mean()), "mse": float(metrics["mse"].mean()),
                     "mae": float(metrics["mae"].mean()), "mase_first": float(mase[first].mean()),
                     "mase_second": float(mase[~first].mean()), "served": served}
    halves = {name: [float(errors[name][1][first].mean()), float(errors[name][1][~first].mean())] for name in names}
    return out, halves


def job(dataset: str, days: int, seed: int, cfg: dict, threads: int) -> dict:
    """One development cell and seed: FedAvg and Local-only trained as in value.py, then every
    gateway's served scores under each rule."""
    import torch

    from edge_agent.selection import candidate_batches, median_batches, window_metrics

    torch.set_num_threads(threads)
    fleet = value.clients(dataset, days, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    value.cached_anchors(fleet, dataset, days, cfg["anchors"], save=False)
    model, models, runs = value.model_config("dlinear", dataset), {}, []
    for name in ("local", "fedavg"):
        per_client, models[name] = value.trained(fleet, model, name, seed, cfg)
        runs.append({"dataset": dataset, "history_days": days, "backbone": "dlinear", "method": name, "seed": seed,
                     "clients": {c: {k: v for k, v in s.items() if k != "windows"} for c, s in per_client.items()}})
    per_rule: dict[str, dict] = {rule: {} for rule in RULES}
    halves = {}
    for index, client in enumerate(fleet):
        members = {"federated": models["fedavg"][index], "local": models["local"][index],
                   **dict.fromkeys(cfg["anchors"])}
        batches = {split: {n: b for n, m in members.items() if (b := candidate_batches(client, n, m, split))}
                   for split in ("val", "test")}
        for split in batches:
            batches[split]["median"] = median_batches(list(batches[split].values()))
        names = [n for n in batches["test"] if n in batches["val"]]
        errors = {n: tuple(window_metrics(batches[s][n], getattr(client, s).scale)["mase"] for s in ("val", "test"))
                  for n in names}
        forecasts = {n: torch.cat([f for f, _ in batches["test"][n]]) for n in names}
        scores, halves[client.name] = rule_scores(client, forecasts, errors)
        for rule, score in scores.items():
            per_rule[rule][client.name] = score
    runs += [{"dataset": dataset, "history_days": days, "backbone": "dlinear", "method": f"rule:{rule}", "seed": seed,
              "clients": clients} for rule, clients in per_rule.items()]
    runs.append({"dataset": dataset, "history_days": days, "backbone": "dlinear", "method": "halves", "seed": seed,
                 "clients": halves})
    return {"runs": runs}


def study(data: dict, cfg: dict) -> list[dict]:
    """Per rule and part of the test days: cells met, fleet-mean served MASE, the worst gateway
    against the anchor its validation picks and the least share of gateways within 2% of it."""
    halves = {(r["dataset"], r["history_days"]): r["clients"] for r in data["learned"] if r["method"] == "halves"}
    learned = [r for r in data["learned"] if r["method"] in ("local", "fedavg")]
    rows = []
    for part, index in zip(HALVES, (None, 0, 1)):
        anchors = copy.deepcopy(data["anchor"])
        for r in anchors if index is not None else []:
            for client, scores in r["clients"].items():
                scores["mase"] = halves[r["dataset"], r["history_days"]][client][r["method"]][index]
        for rule in RULES:
            served = [copy.deepcopy({**r, "method": SERVED}) for r in data["learned"] if r["method"] == f"rule:{rule}"]
            for r in served if index is not None else []:
                for scores in r["clients"].values():
                    scores["mase"] = scores[f"mase_{part}"]
            summary = summarize(anchors + learned + served, cfg)
            cells = verdicts(summary, cfg)["served_at_most_best_anchor"]
            mine = [r for r in summary if r["method"] == SERVED]
            rows.append({"rule": rule, "part": part, "cells_met": sum(c["met"] for c in cells), "cells": len(cells),
                         "mase": float(np.mean([r["mase"] for r in mine])),
                         "worst_gateway_vs_val_anchor": max(r["worst_gateway_vs_val_anchor"] for r in mine),
                         "least_within_2pct": min(r["gateways_within_2pct"] for r in mine),
                         "failed": [f"{c['dataset']} {c['history_days'] or 'full'}" for c in cells if not c["met"]]})
    return rows


def markdown(summary: dict) -> str:
    lines = ["| rule | part of test days | cells met | fleet served MASE | worst gateway vs its val anchor | "
             "least within 2% | cells failed |", "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['rule']} | {r['part']} | {r['cells_met']}/{r['cells']} | {r['mase']:.4f} | "
                     f"{r['worst_gateway_vs_val_anchor']:+.1%} | {r['least_within_2pct']:.0%} | "
                     f"{', '.join(r['failed']) or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="value.py's quick development fleets (the only mode)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=Path, help="where the trained runs are kept (JSON), read by --report-only")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    cfg = {**value.QUICK, "learned": ["local", "fedavg"]}
    started = time.perf_counter()
    if args.report_only:
        data = json.loads(args.runs.read_text())
    else:
        with tempfile.TemporaryDirectory() as cache:
            os.environ[value.ANCHOR_CACHE] = cache
            anchor_jobs = [(d, k, None, a, None, cfg) for d, k, _, a, _, _ in value.jobs(cfg) if a is not None]
            anchors = [r for res in run_parallel(value.run_job, anchor_jobs, args.workers, value.describe)
                       for r in res["runs"]]
            learned_jobs = [(d, k, s, cfg) for d, k, b, _, s, _ in value.jobs(cfg) if b is not None]
            learned = [r for res in run_parallel(job, learned_jobs, args.workers, lambda r: "trained")
                       for r in res["runs"]]
        data = {"anchor": value.public(anchors), "learned": learned,
                "config": run_config(cfg, True, started)}
        if args.runs:
            args.runs.write_text(json.dumps(data))
    summary = {"rows": study(data, cfg), "config": data["config"]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "combination.json").write_text(json.dumps(summary, indent=2))
    (args.out / "combination.md").write_text(markdown(summary))
    print(markdown(summary))


if __name__ == "__main__":
    main()
