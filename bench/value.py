"""Does joining the fleet pay? Fed variants vs Local-only vs Centralized where sharing can help.

Two real multi-site datasets: the bundled weather stations (feature-level non-IID clients carved
from the seven pvlib sites as in bench/fedqaper.py: 10 in quick mode, 20 in full mode) and 16 homes of CityLearn 2022 (load and PV
per home, bench/datasets.py). Each client keeps only the last K days of training history
(K in 14, 30, 90 and the full training split); validation and test stay fixed. Methods: Local-only
(each client alone, early stopping), Centralized (one shared part trained on every client's
batches), FedAvg (FedPer), FedRep-style FedPer (2 epochs fitting the personal part to each new
global state before the joint local epoch), and the same with ``keep_local`` (each gateway serves
its local-only model where that validates better). Reported per (dataset, K, backbone,
method) over seeds: test MSE mean and half-range, how many clients beat their Local-only model,
and the share of the centralized gain that federation captures, (Local - Fed) / (Local -
Centralized), where Centralized beats Local. Usage:

    python bench/value.py --quick     # DLinear, about 15 min on 2 cores
    python bench/value.py             # 4 backbones, more rounds
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from common import bench_parser, capped_stride, configure, run_config, run_parallel, save_figure, write_report

QUICK = {
    "datasets": ["stations", "homes"], "history_days": [14, 30, 90, 0], "backbones": ["dlinear"],
    "seeds": [1, 2, 3], "clients": 10, "f_max": 20, "lookback": 48, "horizon": 24, "d_qap": 32, "qap_heads": 4,
    "hidden": 32, "d_ff": 64, "heads": 4, "batch_size": 32, "lr": 3e-3, "rounds": 6, "local_epochs": 1,
    "patience": 3, "max_windows": 96, "val_stride": 24,
}
FULL = {**QUICK, "backbones": ["dlinear", "itransformer", "spikernn", "ispikformer"], "clients": 20, "rounds": 24,
        "max_windows": 512, "val_stride": 1}
METHODS = ("local", "centralized", "fedavg", "fedrep", "fedrep_select")
FEDERATED = {"fedavg": {}, "fedrep": {"personal_epochs": 2}, "fedrep_select": {"personal_epochs": 2, "keep_local": True}}


@functools.lru_cache(maxsize=8)
def clients(dataset: str, days: int, cfg_items: tuple) -> list:
    """The dataset's clients with K days of training history (0: all), windowed once per worker.
    Training windows are subsampled to at most ``max_windows`` per client so every K costs about
    the same; validation and test windows are the same for every K."""
    from edge_agent.data import build_pool, feature_clients, load_sites, prepare_client, split_bounds
    from datasets import citylearn_homes

    cfg = dict(cfg_items)
    tables = citylearn_homes() if dataset == "homes" else [build_pool(load_sites())]
    rows = days * 24 if days else split_bounds(tables[0].n_rows, cfg["lookback"], cfg["horizon"])["train"][1]
    stride = capped_stride(rows, cfg["lookback"], cfg["horizon"], cfg["max_windows"])
    common = dict(lookback=cfg["lookback"], horizon=cfg["horizon"], stride=stride, val_stride=cfg["val_stride"],
                  history=days * 24 if days else None)
    if dataset == "homes":
        return [prepare_client(t, **common) for t in tables]
    return feature_clients(tables[0], cfg["clients"], cfg["f_max"], 42, **common)


def run_job(dataset: str, days: int, backbone: str, method: str, seed: int, cfg: dict, threads: int) -> dict:
    """One method on one (dataset, history, backbone) with one seed; per-client test MSE too."""
    import torch

    from coordinator.simulation.baselines import TrainingBudget, run_centralized, run_local_only
    from coordinator.simulation.federation import FederationConfig, run_federation
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    fleet = clients(dataset, days, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    model = ModelConfig(backbone=backbone, lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
                        qap_heads=cfg["qap_heads"], hidden=cfg["hidden"], d_ff=cfg["d_ff"], heads=cfg["heads"])
    fed = FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"],
                           lr=cfg["lr"], seed=seed, local_patience=cfg["patience"], test_every_round=False,
                           **FEDERATED.get(method, {}))
    if method in ("local", "centralized"):
        result = (run_local_only if method == "local" else run_centralized)(fleet, model, TrainingBudget.matching(fed))
    else:
        result = run_federation(fleet, model, fed)
    return {"dataset": dataset, "history_days": days, "backbone": backbone, "method": method, "seed": seed,
            "mse": result.test.mse, "mae": result.test.mae,
            "client_mse": {name: m.mse for name, m in result.client_test.items()},
            "seconds": time.perf_counter() - started}


def jobs(cfg: dict) -> list[tuple]:
    return [(d, k, b, m, s, cfg) for d in cfg["datasets"] for k in cfg["history_days"] for b in cfg["backbones"]
            for m in METHODS for s in cfg["seeds"]]


def rows_with_wins(runs: list[dict]) -> list[dict]:
    """The result rows, each with how many of its clients beat their Local-only model (same seed)."""
    local = {(r["dataset"], r["history_days"], r["backbone"], r["seed"]): r["client_mse"]
             for r in runs if r["method"] == "local"}
    rows = []
    for r in runs:
        alone = local[r["dataset"], r["history_days"], r["backbone"], r["seed"]]
        better = sum(r["client_mse"][c] < alone[c] for c in alone)
        worst = max(r["client_mse"][c] / alone[c] - 1 for c in alone)
        rows.append({**{k: r[k] for k in ("dataset", "history_days", "backbone", "method", "seed", "mse", "mae")},
                     "clients_better_than_local": better, "clients": len(alone), "worst_client_vs_local": worst})
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """Mean and half-range over seeds per (dataset, K, backbone, method), and the captured share."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["history_days"], r["backbone"], r["method"]), []).append(r)
    means = {key: sum(r["mse"] for r in group) / len(group) for key, group in groups.items()}
    out = []
    for (dataset, days, backbone, method), group in groups.items():
        values = [r["mse"] for r in group]
        local, central = means[dataset, days, backbone, "local"], means[dataset, days, backbone, "centralized"]
        captured = (local - means[dataset, days, backbone, method]) / (local - central) if central < local else None
        out.append({"dataset": dataset, "history_days": days, "backbone": backbone, "method": method,
                    "mse_mean": means[dataset, days, backbone, method], "mse_spread": (max(values) - min(values)) / 2,
                    "captured_share": captured, "central_gain": (local - central) / local,
                    "clients_better_than_local": sum(r["clients_better_than_local"] for r in group),
                    "client_runs": sum(r["clients"] for r in group),
                    "worst_client_vs_local": max(r["worst_client_vs_local"] for r in group)})
    return out


def markdown(summary: dict) -> str:
    lines = ["Test MSE (normalized), mean ± half-range over seeds; 'captured' = (Local - method) / (Local - "
             "Centralized) where Centralized beats Local; 'beat local' = client runs better than their own "
             "Local-only model; 'worst client' = the largest relative excess of one client's test MSE over its "
             "Local-only model's, over clients and seeds.", "",
             "| dataset | K days | backbone | method | MSE | captured | beat local | worst client |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary["summary"]:
        days = s["history_days"] or "full"
        captured = "-" if s["captured_share"] is None else f"{s['captured_share']:.0%}"
        lines.append(f"| {s['dataset']} | {days} | {s['backbone']} | {s['method']} | {s['mse_mean']:.4f} ± "
                     f"{s['mse_spread']:.4f} | {captured} | {s['clients_better_than_local']}/{s['client_runs']} | "
                     f"{s['worst_client_vs_local']:+.1%} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """MSE vs history days per method, one panel per (dataset, backbone)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(s["dataset"], s["backbone"]) for s in summary["summary"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    days = summary["config"]["history_days"]
    ticks = [d or max(d for d in days) * 3 for d in days]  # "full" drawn to the right of the largest K
    for ax, (dataset, backbone) in zip(axes[0], panels):
        for method in METHODS:
            by = {s["history_days"]: s["mse_mean"] for s in summary["summary"]
                  if (s["dataset"], s["backbone"], s["method"]) == (dataset, backbone, method)}
            ax.plot(ticks, [by[d] for d in days], marker="o", label=method)
        ax.set(xscale="log", title=f"{dataset}, {backbone}", xlabel="training history (days)", ylabel="test MSE")
        ax.minorticks_off()
        ax.set_xticks(ticks, [str(d or "full") for d in days])
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "DLinear only, 6 rounds (about 15 min on 2 cores)"),
                                   QUICK, FULL)
    runs = run_parallel(run_job, jobs(cfg), args.workers,
                        lambda r: f"{r['dataset']:>8} K={r['history_days'] or 'full':>4} {r['backbone']:>8} "
                                  f"{r['method']:>13} seed {r['seed']}: MSE {r['mse']:.4f} ({r['seconds']:.0f} s)")
    rows = rows_with_wins(runs)
    summary = {"rows": rows, "summary": summarize(rows), "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "value", summary, markdown, plot)


if __name__ == "__main__":
    main()
