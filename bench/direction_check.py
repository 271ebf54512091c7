"""What the direction check (``robust.min_cosine``) costs honest gateways and what it catches.

The check rejects an update whose delta has a cosine below ``min_cosine`` with the round's
coordinate-wise median delta (``coordinator/strategies/bounds.py``). Whether it belongs in the
default depends on two distributions, both read from the cosines the engine's screen computes
(a probe around ``cosines_to_median``; nothing else changes):

- **honest**: FedAvg on the value benchmark's real fleets (``bench/value.py``'s stations, homes and
  pedestrians, K days of history, the product's recipe), once without the check and once with
  ``min_cosine = 0``: every honest update's cosine, how many the check rejects, and the fleet's
  test MASE with and without it, beside each anchor's on the same clients and windows;
- **attacker**: ``bench/robustness.py``'s below-screen cells (1 of 7, 2 of 7), the attackers'
  cosines under ``below_screen`` and ``below_screen_hello`` with the check on.

    python bench/direction_check.py --quick     # K = 30, seeds 1 and 2 (about 10 min on 2 cores)
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

from common import bench_parser, configure, panel_row, run_config, run_parallel, save_figure, write_report

QUICK = {"datasets": ["stations", "homes", "pedestrians"], "history_days": 30, "seeds": [1, 2],
         "thresholds": [0.0, -0.1, -0.2], "attacks": ["below_screen", "below_screen_hello"],
         "cells": [[1, 7], [2, 7]]}
FULL = {**QUICK, "seeds": [1, 2, 3]}


@contextlib.contextmanager
def recorded_cosines() -> Iterator[list[tuple[str, float]]]:
    """(client id, cosine) of every update the screen scores while the block runs."""
    import coordinator.strategies.bounds as bounds

    seen: list[tuple[str, float]] = []
    original = bounds.cosines_to_median

    def probe(current, updates, names, norms):
        cosines = original(current, updates, names, norms)
        seen.extend((u.client_id, c) for u, c in zip(updates, cosines))
        return cosines
    bounds.cosines_to_median = probe
    try:
        yield seen
    finally:
        bounds.cosines_to_median = original


def honest_job(dataset: str, days: int, seed: int, threads: int) -> dict:
    """FedAvg on one value fleet without and with the check: test MASE of each, and the cosines."""
    import torch
    from value import QUICK as VALUE, anchored, clients, model_config, scored

    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.config import AgentTraining
    from edge_agent.train import forecasts

    torch.set_num_threads(threads)
    fleet = clients(dataset, days, tuple(sorted((k, v) for k, v in VALUE.items() if not isinstance(v, list))))
    recipe = AgentTraining()
    out = {"kind": "honest", "dataset": dataset, "seed": seed,
           "anchors": {name: statistics.fmean(c["mase"] for c in anchored(fleet, name).values())
                       for name in VALUE["anchors"]}}
    for label, min_cosine in (("off", None), ("on", 0.0)):
        fed = FederationConfig(rounds=VALUE["rounds"], local_epochs=VALUE["local_epochs"], batch_size=recipe.batch_size,
                               lr=recipe.lr, min_steps=recipe.min_steps, seed=seed, test_every_round=False,
                               robust={"min_cosine": min_cosine})
        with recorded_cosines() as seen:
            result = run_federation(fleet, model_config("dlinear", dataset), fed)
        mase = [scored(c, forecasts(m, c.val), forecasts(m, c.test))["mase"] for c, m in zip(fleet, result.models)]
        out[f"mase_{label}"] = statistics.fmean(mase)
        if label == "on":
            out["cosines"] = [c for _, c in seen]
            out["rejected"] = sum(len(r.rejected) for r in result.records)
            out["updates"] = sum(len(r.present) for r in result.records)
    return out


def attacker_job(attack: str, attackers: int, clients: int, seed: int, threads: int) -> dict:
    """One robustness cell with the check on: the attackers' cosines and the honest ones'."""
    import robustness

    cfg = {**robustness.QUICK, "clients": clients}
    names = {c.name for c in robustness.fleet(tuple(sorted((k, v) for k, v in cfg.items()
                                                            if not isinstance(v, list))))[:attackers]}
    with recorded_cosines() as seen:
        run = robustness.run_job("fedavg_cosine", attack, attackers, seed, cfg, threads)
    return {"kind": "attacker", "attack": attack, "attackers": attackers, "clients": clients, "seed": seed,
            "attacker_cosines": [c for n, c in seen if n in names], "honest_cosines": [c for n, c in seen if n not in names],
            "honest_rejected": run["honest_rejected"]}


def below(values: list[float], threshold: float) -> float:
    return sum(v < threshold for v in values) / len(values) if values else float("nan")


def summarize(runs: list[dict], cfg: dict) -> dict:
    """Per dataset: the honest cosines' spread, the share each threshold would reject, MASE off/on;
    per attack cell: the share of the attackers' updates each threshold would reject."""
    honest, attacked = [], []
    for dataset in cfg["datasets"]:
        group = [r for r in runs if r["kind"] == "honest" and r["dataset"] == dataset]
        cosines = sorted(c for r in group for c in r["cosines"])
        honest.append({"dataset": dataset, "updates_scored": len(cosines), "cosines": cosines, "min": cosines[0],
                       "p05": cosines[len(cosines) // 20], "median": statistics.median(cosines),
                       "rejected_share": {str(t): below(cosines, t) for t in cfg["thresholds"]},
                       "anchors": group[0]["anchors"], "best_anchor": min(group[0]["anchors"], key=group[0]["anchors"].get),
                       "mase_off": statistics.fmean(r["mase_off"] for r in group),
                       "mase_on": statistics.fmean(r["mase_on"] for r in group)})
    for attack in cfg["attacks"]:
        for k, n in cfg["cells"]:
            group = [r for r in runs if r["kind"] == "attacker" and (r["attack"], r["attackers"]) == (attack, k)]
            cosines = [c for r in group for c in r["attacker_cosines"]]
            attacked.append({"attack": attack, "attackers": k, "clients": n, "updates_scored": len(cosines),
                             "cosines": cosines, "median": statistics.median(cosines),
                             "caught_share": {str(t): below(cosines, t) for t in cfg["thresholds"]}})
    return {"honest": honest, "attacker": attacked}


def markdown(summary: dict) -> str:
    thresholds = summary["config"]["thresholds"]
    heads = " | ".join(f"< {t:g}" for t in thresholds)
    lines = [f"Honest updates on the value fleets (K = {summary['config']['history_days']} days, FedAvg, the recipe): "
             "their cosine with the round's median delta, the share each threshold would reject, and the fleet's "
             "test MASE without and with `min_cosine = 0`, beside the best anchor's on the same clients and "
             "windows (each anchor fitted on its client's own history).", "",
             f"| dataset | updates | min | p5 | median | {heads} | MASE off | MASE on | best anchor |",
             "|---|---|---|---|---|" + "---|" * len(thresholds) + "---|---|---|"]
    for h in summary["honest"]:
        shares = " | ".join(f"{h['rejected_share'][str(t)]:.1%}" for t in thresholds)
        lines.append(f"| {h['dataset']} | {h['updates_scored']} | {h['min']:.3f} | {h['p05']:.3f} | {h['median']:.3f} | "
                     f"{shares} | {h['mase_off']:.4f} | {h['mase_on']:.4f} | "
                     f"{h['best_anchor']} {h['anchors'][h['best_anchor']]:.4f} |")
    lines += ["", "Attackers' updates (bench/robustness.py's cells, the check on): the share each threshold catches.",
              "", f"| attack | attackers | updates | median cosine | {heads} |",
              "|---|---|---|---|" + "---|" * len(thresholds)]
    for a in summary["attacker"]:
        shares = " | ".join(f"{a['caught_share'][str(t)]:.1%}" for t in thresholds)
        lines.append(f"| {a['attack']} | {a['attackers']} of {a['clients']} | {a['updates_scored']} | "
                     f"{a['median']:.3f} | {shares} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path) -> None:
    """The honest cosines per dataset beside the attackers' per cell, as strip plots; the dashed line
    is ``min_cosine = 0``."""
    fig, (ax,) = panel_row(1, 8.0)
    groups = [(h["dataset"], h["cosines"]) for h in summary["honest"]] + \
             [(f"{a['attack']}\n{a['attackers']}/{a['clients']}", a["cosines"]) for a in summary["attacker"]]
    for i, (_, values) in enumerate(groups):
        ax.plot([i] * len(values), values, "o", alpha=0.35, ms=3)
    ax.axhline(0.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(groups)), [g for g, _ in groups], fontsize=6)
    ax.set(ylabel="cosine with the round's median delta", title="honest updates (value fleets) and attackers")
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "K = 30 days, seeds 1 and 2")
    args, cfg, started = configure(parser, QUICK, FULL)
    jobs = [(honest_job, (d, cfg["history_days"], s)) for d in cfg["datasets"] for s in cfg["seeds"]]
    jobs += [(attacker_job, (a, k, n, s)) for a in cfg["attacks"] for k, n in cfg["cells"] for s in cfg["seeds"]]
    runs = run_parallel(run_one, jobs, args.workers, describe)
    summary = {**summarize(runs, cfg), "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "direction_check", summary, markdown, plot)


def run_one(job, arguments: tuple, threads: int) -> dict:
    return job(*arguments, threads)


def describe(run: dict) -> str:
    if run["kind"] == "honest":
        return f"honest {run['dataset']} seed {run['seed']}: {run['rejected']} of {run['updates']} rejected"
    return f"{run['attack']} {run['attackers']} of {run['clients']} seed {run['seed']}: attacker cosines " \
           f"{', '.join(f'{c:.2f}' for c in run['attacker_cosines'])}"


if __name__ == "__main__":
    main()
