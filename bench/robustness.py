"""Robustness of the fleet against a bad gateway: model poisoning, fuzzed messages, network faults.

Attacks: 3 or 7 feature-level non-IID clients carved from the bundled weather stations (as in
bench/fedqaper.py), DLinear with FedPer heads, a few rounds. In each cell (1 of 3, 1 of 7, 2 of
7) the first clients tamper with what they upload (coordinator/simulation/attacks.py: every
weight x1000, every weight 1e30, the delta reversed and boosted x10, reversed at 3x its own norm
to stay under the clip bound, with or without 10**12 samples declared at hello, the reversed
delta claimed for 10**12 samples in the update, or at hello too); the round engine and the
aggregation are the real ones. Aggregators: FedAvg with the engine's bounds off (weights still
bounded by the hello), FedAvg with the norm bounds only (weights at most 3x the fleet's median
declared count, deltas rejected beyond 20x the round's median delta norm and clipped at 4x,
``fedavg_clip``, or 1x, ``fedavg_clip1``, that median: the bounds before issue 27), FedAvg with
the default bounds (those and updates against the round's coordinate-wise median delta
rejected, ``fedavg_cosine``), coordinate-wise median and trimmed mean (Yin et al. 2018) with the
default bounds of the row's commit. ``final_loss`` is the mean test MSE of
the honest clients after the last round, ``clean_loss`` the same clients' with the same
aggregator and no attacker; means over seeds, null where a run diverged (non-finite loss). Fuzz (bench/fuzz.py), faults (bench/faults.py)
influence over time (bench/over_time.py: the flipper over 50 rounds, trust on and off) and trust's
false alarms on the value fleets (bench/trust_alarms.py) are the other sections of the same report. Usage:

    python bench/robustness.py --quick                 # all sections, 5 rounds, 2 seeds
    python bench/robustness.py --quick --only attacks  # one section; the others kept from the last report
    python bench/robustness.py --quick --only over_time  # 50 rounds, 1 of 4 and 1 of 7, trust on and off, 2 seeds
    python bench/robustness.py --quick --only value_alarms  # trust on and off on value.py's dev fleets, 3 seeds
    python bench/robustness.py --quick --only attacks --attacks below_screen --aggregators median
                          # those rows only; the other rows kept from the last report, each with its commit
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

from common import bench_parser, commit, configure, run_config, run_parallel, save_figure, write_report
from over_time import markdown_lines, run_over_time
from trust_alarms import alarm_lines, run_value_alarms

QUICK = {
    "cells": [[1, 3], [1, 7], [2, 7]], "f_max": 20, "lookback": 48, "horizon": 24, "d_qap": 32, "qap_heads": 4, "hidden": 32,
    "d_ff": 64, "heads": 4, "stride": 29, "val_stride": 24, "batch_size": 32, "lr": 3e-3, "rounds": 5,
    "local_epochs": 1, "seeds": [1, 2], "fuzz_inputs": 100_000, "fuzz_seed": 0,
    "over_time_clients": [4, 7], "over_time_rounds": 50, "over_time_seeds": [1, 2],
    "alarm_datasets": ["stations", "homes", "pedestrians"], "alarm_days": [14], "alarm_seeds": [1, 2, 3],
}
FULL = {**QUICK, "stride": 7, "val_stride": 4, "rounds": 20, "seeds": [1, 2, 3], "fuzz_inputs": 1_000_000,
        "over_time_seeds": [1, 2, 3]}
AGGREGATORS = {
    "fedavg": {"strategy": "fedavg",
               "robust": {"clip_factor": None, "reject_factor": None, "weight_factor": None, "min_cosine": None}},
    "fedavg_clip": {"strategy": "fedavg", "robust": {"clip_factor": 4.0, "min_cosine": None}},
    "fedavg_clip1": {"strategy": "fedavg", "robust": {"clip_factor": 1.0, "min_cosine": None}},
    "fedavg_cosine": {"strategy": "fedavg", "robust": {"clip_factor": 4.0, "min_cosine": 0.0}},
    "median": {"strategy": "median"},
    "trimmed_mean": {"strategy": "trimmed_mean"},
}
SECTIONS = ("attacks", "fuzz", "faults", "over_time", "value_alarms")
CLEAN = "none"


@functools.lru_cache(maxsize=4)
def fleet(cfg_items: tuple) -> list:
    """The stations' feature-level clients, windowed once per worker."""
    from edge_agent.data import build_pool, feature_clients, load_sites

    cfg = dict(cfg_items)
    return feature_clients(build_pool(load_sites()), cfg["clients"], cfg["f_max"], 42, lookback=cfg["lookback"],
                           horizon=cfg["horizon"], stride=cfg["stride"], val_stride=cfg["val_stride"])


def run_job(aggregator: str, attack: str, attackers: int, seed: int, cfg: dict, threads: int) -> dict:
    """One federation of ``cfg["clients"]`` clients with the first ``attackers`` mounting ``attack``
    (``none``: clean); every client's test MSE after the last round and the rejections the engine
    reported."""
    import torch

    from coordinator.simulation.attacks import claims_for, tamper_for
    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    clients = fleet(tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    bad = {c.name for c in clients[:attackers]}
    model = ModelConfig.paper(backbone="dlinear", lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
                        qap_heads=cfg["qap_heads"], hidden=cfg["hidden"], d_ff=cfg["d_ff"], heads=cfg["heads"])
    fed = FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"],
                           lr=cfg["lr"], seed=seed, test_every_round=False, tested_round="last",
                           **AGGREGATORS[aggregator])
    attacked = attack != CLEAN
    result = run_federation(clients, model, fed, tamper=tamper_for(attack, bad) if attacked else None,
                            claims=claims_for(attack, bad) if attacked else None)
    rejected = [client for record in result.records for client in record.rejected]
    return {"aggregator": aggregator, "attack": attack, "attackers": sorted(bad), "clients": len(clients), "seed": seed,
            "client_mse": {name: finite(m.mse) for name, m in result.client_test.items()},
            "rejected": len(rejected), "honest_rejected": sum(c not in bad for c in rejected),
            "seconds": time.perf_counter() - started}


def finite(value: float) -> float | None:
    """JSON has no NaN or infinity: a diverged figure is null."""
    return value if math.isfinite(value) else None


def honest_mean(client_mse: dict[str, float | None], attackers: list[str]) -> float | None:
    values = [v for name, v in client_mse.items() if name not in attackers]
    return None if None in values else sum(values) / len(values)


def mean(values: list[float | None]) -> float | None:
    return None if None in values or not values else sum(values) / len(values)


def attack_jobs(cfg: dict, attacks: list[str], aggregators: list[str]) -> list[tuple]:
    """Every aggregator clean on every fleet size, then under every attack in every (attackers,
    clients) cell, per seed."""
    sizes = sorted({n for _, n in cfg["cells"]})
    clean = [(a, CLEAN, 0, s, {**cfg, "clients": n}) for n in sizes for a in aggregators for s in cfg["seeds"]]
    return clean + [(a, attack, k, s, {**cfg, "clients": n}) for attack in attacks for k, n in cfg["cells"]
                    for a in aggregators for s in cfg["seeds"]]


def attack_rows(runs: list[dict], cfg: dict) -> list[dict]:
    """One row per (attack, attackers, clients, aggregator): honest clients' final and clean loss
    (mean over seeds, and each seed's), rejections summed over seeds and rounds."""
    clean = {(r["aggregator"], r["clients"], r["seed"]): r["client_mse"] for r in runs if r["attack"] == CLEAN}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["attack"] != CLEAN:
            groups.setdefault((r["attack"], len(r["attackers"]), r["clients"], r["aggregator"]), []).append(r)
    rows = []
    for (attack, k, n, aggregator), group in groups.items():
        final = [honest_mean(r["client_mse"], r["attackers"]) for r in group]
        base = [honest_mean(clean[aggregator, n, r["seed"]], r["attackers"]) for r in group]
        rows.append({"attack": attack, "attackers": k, "of_clients": n, "aggregator": aggregator,
                     "final_loss": mean(final), "clean_loss": mean(base),
                     "rejected": sum(r["rejected"] for r in group),
                     "honest_rejected": sum(r["honest_rejected"] for r in group),
                     "attacker_updates": k * cfg["rounds"] * len(group),
                     "final_losses": final, "clean_losses": base, "commit": commit()})
    return rows


def merged(old: list[dict], new: list[dict]) -> list[dict]:
    """The last report's rows with those measured again replaced (same attack, cell and
    aggregator), then the rows it did not have."""
    fresh = {row_key(r): r for r in new}
    kept = [fresh.pop(row_key(r), r) for r in old]
    return kept + list(fresh.values())


def row_key(row: dict) -> tuple:
    return row["attack"], row["attackers"], row["of_clients"], row["aggregator"]


def run_attacks(cfg: dict, attacks: list[str], aggregators: list[str], workers: int) -> list[dict]:
    runs = run_parallel(run_job, attack_jobs(cfg, attacks, aggregators), workers,
                        lambda r: f"{r['aggregator']:>12} {r['attack']:>19} {len(r['attackers'])} of {r['clients']} "
                                  f"seed {r['seed']}: "
                                  f"honest MSE {honest_mean(r['client_mse'], r['attackers'])}, "
                                  f"{r['rejected']} rejected ({r['seconds']:.0f} s)")
    return attack_rows(runs, cfg)


def run_fuzz_section(cfg: dict) -> dict:
    """The decoder and round-handler fuzz harness (bench/fuzz.py)."""
    from fuzz import run_fuzz

    return run_fuzz(cfg["fuzz_inputs"], cfg["fuzz_seed"])


def run_faults_section(quick: bool) -> list[dict]:
    """The small fleet through network faults (bench/faults.py)."""
    from faults import run_faults

    return run_faults(quick)


def relative(row: dict) -> float | None:
    """final / clean - 1, or None where either diverged."""
    if row["final_loss"] is None or row["clean_loss"] is None:
        return None
    return row["final_loss"] / row["clean_loss"] - 1


def loss(value: float | None, seeds: list[float | None]) -> str:
    """Mean ± half-range over seeds, or ``diverged``."""
    if value is None:
        return "diverged"
    return f"{value:.4f} ± {(max(seeds) - min(seeds)) / 2:.4f}"


def markdown(summary: dict) -> str:
    lines = ["Honest clients' test MSE (normalized) after the last round, mean ± half-range over seeds; 'vs "
             "clean' = final / clean - 1 with the same aggregator; 'diverged' = non-finite loss; 'rejected' = "
             "updates the engine left out, over seeds and rounds (of them honest), out of the attackers' updates; "
             "'commit' = the code the row was measured on.",
             "",
             "| attack | attackers | aggregator | final loss | clean loss | vs clean | rejected (honest) / sent | commit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in summary["attacks"]:
        change = relative(r)
        shown = "-" if change is None else f"{change:+.1%}"
        lines.append(f"| {r['attack']} | {r['attackers']} of {r['of_clients']} | {r['aggregator']} | "
                     f"{loss(r['final_loss'], r['final_losses'])} | {loss(r['clean_loss'], r['clean_losses'])} | "
                     f"{shown} | {r['rejected']} ({r['honest_rejected']}) / {r['attacker_updates']} | "
                     f"{r['commit'][:7]} |")
    fuzz = summary["fuzz"]
    if fuzz:
        lines += ["", f"Fuzz: {fuzz['inputs']} inputs, {fuzz['crashes']} crashes, {fuzz['seconds']:.0f} s."]
    if summary["over_time"]:
        lines += markdown_lines(summary["over_time"])
    if summary["value_alarms"]:
        lines += alarm_lines(summary["value_alarms"])
    if summary["faults"]:
        lines += ["", "| fault | rounds completed | updates lost |", "|---|---|---|"]
        lines += [f"| {f['fault']} | {f['rounds_completed']} | {f['updates_lost']} |" for f in summary["faults"]]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """final / clean per aggregator and attack, one panel per (attackers, clients) cell; diverged
    runs at the cap; the dashed line is the +5% the default aggregation must hold (issue 27)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((r["attackers"], r["of_clients"]) for r in summary["attacks"]))
    attacks = list(dict.fromkeys(r["attack"] for r in summary["attacks"]))
    width = 0.8 / len(AGGREGATORS)
    fig, axes = plt.subplots(1, max(len(cells), 1), figsize=(6 * max(len(cells), 1), 3.6), squeeze=False)
    for ax, (k, n) in zip(axes[0], cells):
        for i, aggregator in enumerate(AGGREGATORS):
            rows = {r["attack"]: r for r in summary["attacks"]
                    if (r["attackers"], r["of_clients"], r["aggregator"]) == (k, n, aggregator)}
            shown = [j for j, a in enumerate(attacks) if a in rows]
            changes = [relative(rows[attacks[j]]) for j in shown]
            ratios = [10.0 if c is None else min(1 + c, 10.0) for c in changes]
            ax.bar([j + width * i for j in shown], ratios, width, label=aggregator)
        ax.axhline(1.05, color="k", lw=0.8, ls="--")
        ax.set(yscale="log", title=f"{k} of {n} attackers", ylabel="final / clean loss (capped at 10)")
        ax.set_xticks([j + 0.4 for j in range(len(attacks))], attacks, fontsize=7, rotation=20)
        ax.legend(fontsize=6)
    save_figure(fig, path)


def previous(out: Path) -> dict:
    """The last report's sections, kept for those not run this time; attack rows from before rows
    carried their commit get the report's."""
    path = out / "robustness.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    measured_at = old.get("config", {}).get("commit", "unknown")
    return {"attacks": [{"commit": measured_at, **row} for row in old.get("attacks", [])], "fuzz": old.get("fuzz", {}),
            "faults": old.get("faults", []), "over_time": old.get("over_time", []),
            "value_alarms": old.get("value_alarms", []), "config": old.get("config", {}),
            "section_configs": old.get("section_configs", {})}


def main() -> None:
    from coordinator.simulation.attacks import ATTACKS

    parser = bench_parser(__doc__, "5 rounds and 2 seeds of attacks, 100,000 fuzz inputs, the short fault plan")
    parser.add_argument("--only", choices=SECTIONS, help="run one section; the others are kept from the last report")
    parser.add_argument("--attacks", nargs="+", choices=ATTACKS, default=list(ATTACKS),
                        help="attacks to run; the other attacks' rows are kept from the last report")
    parser.add_argument("--aggregators", nargs="+", choices=AGGREGATORS, default=list(AGGREGATORS),
                        help="aggregators to run; the other aggregators' rows are kept from the last report")
    args, cfg, started = configure(parser, QUICK, FULL)
    sections = [args.only] if args.only else list(SECTIONS)
    fresh = {"attacks": lambda: run_attacks(cfg, args.attacks, args.aggregators, args.workers),
             "fuzz": lambda: run_fuzz_section(cfg), "faults": lambda: run_faults_section(args.quick),
             "over_time": lambda: run_over_time(cfg, args.workers),
             "value_alarms": lambda: run_value_alarms(cfg, args.workers)}
    results = {section: fresh[section]() for section in sections}
    summary = previous(args.out)  # read last, so a run that wrote other rows meanwhile is kept
    summary.update({**results, "attacks": merged(summary["attacks"], results.get("attacks", []))})
    summary["config"] = {**summary["config"], **run_config(cfg, args.quick, started), "sections": sections}
    summary["section_configs"].update({section: summary["config"] for section in sections})
    write_report(args.out, "robustness", summary, markdown, plot)


if __name__ == "__main__":
    main()
