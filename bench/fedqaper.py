"""FedQAPer on real multi-site weather: Fed (QAP + FedPer) vs Local-only, QAP vs a linear projection.

Reproduces the protocol of FedQAPer section 4.3 (Tables 2 and 4) on the pvlib weather pool:
N clients, each a random subset of 1..F_max site/variable features (section 3.1), chronological
80/10/10 split, per-client scaling, global metrics = dataset-size-weighted client metrics (4.1).
Fed reports the test metrics of the round with the best global validation MSE; Local-only uses
early stopping on each client's validation MSE. Usage:

    python bench/fedqaper.py --quick        # minutes on 2 cores, smaller widths and budgets
    python bench/fedqaper.py                # the paper's sizes (hours on a CPU)
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from common import anchor_lines, anchor_scores, bench_parser, commit, run_parallel, save_figure, write_report

QUICK = {
    "clients": 20, "f_max": 20, "seed": 42, "lookback": 48, "horizon": 24,
    "d_qap": 32, "qap_heads": 4, "hidden": 32, "d_ff": 64, "heads": 4,
    "stride": 29, "val_stride": 7, "batch_size": 32, "lr": 3e-3,
    "rounds": 8, "local_epochs": 1, "local_max_epochs": 8, "patience": 3,
    "backbones": ["ispikformer", "spikernn", "itransformer", "dlinear"],
}
FULL = {
    "clients": 20, "f_max": 20, "seed": 42, "lookback": 96, "horizon": 48,
    "d_qap": 128, "qap_heads": 4, "hidden": None, "d_ff": None, "heads": None,
    "stride": 1, "val_stride": 1, "batch_size": 128, "lr": 1e-3,
    "rounds": 100, "local_epochs": 1, "local_max_epochs": 100, "patience": 20,
    "backbones": ["ispikformer", "spikformer", "spikernn", "itransformer", "lstm", "gru", "dlinear"],
}
VARIANTS = ("fed", "local", "linear")


def run_job(backbone: str, variant: str, cfg: dict, threads: int) -> dict:
    """Train one (backbone, variant) on the weather fleet; runs in a worker process."""
    import torch

    from coordinator.simulation.baselines import TrainingBudget, run_local_only
    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.models import BACKBONES, ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    clients = fleet(cfg)
    model = ModelConfig.paper(
        backbone=backbone, lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
        qap_heads=cfg["qap_heads"], hidden=cfg["hidden"], d_ff=cfg["d_ff"], heads=cfg["heads"],
        projection="linear" if variant == "linear" else "qap",
    )
    out = {"backbone": backbone, "variant": variant, "kind": BACKBONES[backbone].kind}
    if variant == "local":
        budget = TrainingBudget(cfg["local_max_epochs"], cfg["patience"], cfg["batch_size"], cfg["lr"], cfg["seed"])
        res = run_local_only(clients, model, budget)
        out.update(mse=res.test.mse, mae=res.test.mae, mase=res.test.mase, epochs=res.epochs)
    else:
        fed = FederationConfig(
            rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"],
            lr=cfg["lr"], seed=cfg["seed"], test_every_round=False,
        )
        res = run_federation(clients, model, fed)
        out.update(
            mse=res.test.mse, mae=res.test.mae, mase=res.test.mase, best_round=res.best_round,
            val_curve=[r.val.mse for r in res.records],
        )
    out["seconds"] = time.perf_counter() - started
    return out


def fleet(cfg: dict) -> list:
    """The benchmark's clients: feature-level non-IID subsets of the weather pool."""
    from edge_agent.data import build_pool, feature_clients, load_sites

    return feature_clients(
        build_pool(load_sites()), cfg["clients"], cfg["f_max"], cfg["seed"], cfg["lookback"],
        cfg["horizon"], cfg["stride"], val_stride=cfg["val_stride"],
    )


def anchors(cfg: dict) -> dict:
    """Every anchor's test scores on the same clients and windows: what each method must beat."""
    return anchor_scores(fleet(cfg))


def run_all(cfg: dict, workers: int) -> list[dict]:
    """Every (backbone, variant) job over the worker pool."""
    jobs = [(b, v, cfg) for b in cfg["backbones"] for v in VARIANTS]
    return run_parallel(
        run_job, jobs, workers,
        lambda r: f"{r['backbone']:>12} {r['variant']:<6} test MASE {r['mase']:.4f} MSE {r['mse']:.4f} "
        f"({r['seconds']:.0f} s)",
    )


def summarize(results: list[dict], cfg: dict, mode: str, seconds: float, anchor_rows: dict) -> dict:
    """The issue's JSON layout plus per-run details."""
    by = {(r["backbone"], r["variant"]): r for r in results}
    rows, qap = [], []
    for b in cfg["backbones"]:
        fed, local, linear = by[b, "fed"], by[b, "local"], by[b, "linear"]
        rows.append({
            "backbone": b, "kind": fed["kind"], "fed_mse": fed["mse"], "fed_mae": fed["mae"],
            "local_mse": local["mse"], "local_mae": local["mae"], "fed_mase": fed["mase"], "local_mase": local["mase"],
        })
        qap.append({"backbone": b, "qap_mse": fed["mse"], "linear_mse": linear["mse"]})
    return {
        "rows": rows, "qap_vs_linear": qap,
        "anchors": anchor_rows,
        "config": {**cfg, "mode": mode, "wall_seconds": round(seconds, 1), "cpu_count": os.cpu_count(), "commit": commit()},
        "runs": sorted(results, key=lambda r: (r["backbone"], r["variant"])),
    }


def markdown(summary: dict) -> str:
    """Two tables: Fed vs Local-only (Table 2 layout) and QAP vs linear projection (Table 4)."""
    best = min((s["mase"], name) for name, s in summary["anchors"].items() if s)
    lines = [
        "| backbone | kind | Fed MASE | Local MASE | Fed MSE | Local MSE | Fed MAE | Local MAE | Fed better (MSE) "
        f"| Fed vs best anchor ({best[1]}, MASE) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        lines.append(
            f"| {r['backbone']} | {r['kind']} | {r['fed_mase']:.4f} | {r['local_mase']:.4f} | {r['fed_mse']:.4f} | "
            f"{r['local_mse']:.4f} | {r['fed_mae']:.4f} | {r['local_mae']:.4f} | "
            f"{'yes' if r['fed_mse'] < r['local_mse'] else 'no'} | {r['fed_mase'] / best[0] - 1:+.1%} |"
        )
    lines += ["", "| backbone | QAP MSE | linear MSE | QAP better |", "|---|---|---|---|"]
    for r in summary["qap_vs_linear"]:
        lines.append(
            f"| {r['backbone']} | {r['qap_mse']:.4f} | {r['linear_mse']:.4f} | "
            f"{'yes' if r['qap_mse'] < r['linear_mse'] else 'no'} |"
        )
    lines += ["", *anchor_lines(summary["anchors"])]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Global validation MSE per round of the federation, QAP vs linear projection, per backbone."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {(r["backbone"], r["variant"]): r for r in summary["runs"]}
    backbones = [r["backbone"] for r in summary["rows"]]
    fig, axes = plt.subplots(1, len(backbones), figsize=(4 * len(backbones), 3.2), squeeze=False)
    for ax, b in zip(axes[0], backbones):
        for variant, label in (("fed", "QAP + FedPer"), ("linear", "linear + FedPer")):
            curve = runs[b, variant]["val_curve"]
            ax.plot(range(1, len(curve) + 1), curve, marker="o", label=label)
        ax.set(title=b, xlabel="round", ylabel="global val MSE")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "small widths and budgets (minutes on 2 cores)")
    parser.add_argument("--backbones", nargs="+", help="subset of backbones to run")
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    if args.backbones:
        cfg["backbones"] = args.backbones
    started = time.perf_counter()
    results = run_all(cfg, args.workers)
    summary = summarize(results, cfg, "quick" if args.quick else "full", time.perf_counter() - started, anchors(cfg))
    write_report(args.out, "fedqaper", summary, markdown, plot)

if __name__ == "__main__":
    main()
