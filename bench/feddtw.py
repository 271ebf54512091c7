"""FedDTW on real multi-site weather: do digital twins keep dropout runs closer to full participation?

Reproduces the protocol of FedDTW section 4 (Table 1 and Figures 3-6) on the seven pvlib weather
sites, one client per site (each measures its own variables, so QAP + FedPer carries them):
T = 10 past hours predict the next 5, 50% absence under the four scenarios of section 3.3 (RCD,
VCPR, NP, DU), and per model and seed the methods FPR (everyone, every round), FedAvg-drop, stale,
MAF and WSF share one participation matrix and one training seed. Reported: RMSE and MAE of the
global model after the last round (A.3, on the standardized scale) and its per-round NRMSE
(RMSE in units of each variable's training std: the paper's mean-normalization is undefined on
standardized targets). Usage:

    python bench/feddtw.py --quick          # under 10 minutes on 2 cores
    python bench/feddtw.py                  # the paper's 100 rounds x 5 local epochs (hours on a CPU)
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from pathlib import Path

from common import anchor_lines, anchor_scores, bench_parser, commit, run_parallel, save_figure, write_report

QUICK = {
    "lookback": 10, "horizon": 5, "stride": 7, "val_stride": 8, "d_qap": 32, "qap_heads": 4, "hidden": 32,
    "batch_size": 64, "lr": 3e-3, "rounds": 10, "local_epochs": 1, "absence": 0.5, "clusters": 3, "stretch": 2,
    "seeds": [1, 2], "models": ["lstm", "gru", "dlinear"],
}
FULL = {
    "lookback": 10, "horizon": 5, "stride": 1, "val_stride": 1, "d_qap": 128, "qap_heads": 4, "hidden": None,
    "batch_size": 128, "lr": 1e-3, "rounds": 100, "local_epochs": 5, "absence": 0.5, "clusters": 3, "stretch": 5,
    "seeds": [1, 2, 3], "models": ["lstm", "gru", "dlinear", "spikernn"],
}
SCENARIOS = ("rcd", "vcpr", "np", "du")
TWINS = ("drop", "stale", "maf", "wsf")


def run_job(model: str, seed: int, scenario: str, method: str, cfg: dict, threads: int) -> dict:
    """One federation on the site fleet; ``scenario`` "fpr" means full participation."""
    import torch

    from coordinator.simulation.participation import participation
    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    clients = site_clients(cfg["lookback"], cfg["horizon"], cfg["stride"], cfg["val_stride"])
    model_cfg = ModelConfig.paper(
        backbone=model, lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
        qap_heads=cfg["qap_heads"], hidden=cfg["hidden"],
    )
    fed = FederationConfig(
        rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"], lr=cfg["lr"],
        seed=seed, twin="drop" if method == "fpr" else method, personal_epochs=cfg.get("personal_epochs", 0),
        late_updates="history",  # the paper's DU scenario discards late updates (twin history only)
    )
    matrix = None if scenario == "fpr" else participation(
        scenario, cfg["rounds"], len(clients), cfg["absence"], seed, cfg["clusters"], cfg["stretch"]
    )
    result = run_federation(clients, model_cfg, fed, participation=matrix)
    final = result.records[-1].test
    return {
        "model": model, "seed": seed, "scenario": scenario, "method": method,
        "rmse": math.sqrt(final.mse), "mae": final.mae, "mase": final.mase,
        "nrmse_curve": [math.sqrt(r.test.mse) for r in result.records],
        "absence_rate": 0.0 if matrix is None else matrix.absence_rate,
        "imputed": sum(len(r.imputed) for r in result.records),
        "dropped": sum(len(r.dropped) for r in result.records),
        "seconds": time.perf_counter() - started,
    }


@functools.lru_cache(maxsize=1)
def site_clients(lookback: int, horizon: int, stride: int, val_stride: int) -> list:
    """One client per weather site, windowed once per worker process."""
    from edge_agent.data import load_sites, prepare_client

    return [prepare_client(t, lookback, horizon, stride, val_stride=val_stride) for t in load_sites()]


def jobs(cfg: dict) -> list[tuple]:
    """FPR once per (model, seed); every twin method on every scenario with the same seed."""
    out = []
    for model in cfg["models"]:
        for seed in cfg["seeds"]:
            out.append((model, seed, "fpr", "fpr", cfg))
            out += [(model, seed, s, m, cfg) for s in SCENARIOS for m in TWINS]
    return out


def mean_spread(values: list[float]) -> tuple[float, float]:
    """Mean over seeds and the spread, half the range."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def summarize(runs: list[dict], cfg: dict, mode: str, seconds: float) -> dict:
    """The issue's rows (mean over seeds) plus, per scenario and model, each twin's gap to FPR
    against FedAvg-drop's, paired by seed."""
    by = {(r["model"], r["seed"], r["scenario"], r["method"]): r for r in runs}
    rows, comparison = [], []
    for model in cfg["models"]:
        keys = [("fpr", "fpr")] + [(s, m) for s in SCENARIOS for m in TWINS]
        for scenario, method in keys:
            seeds = [by[model, seed, scenario, method] for seed in cfg["seeds"]]
            rmse, rmse_spread = mean_spread([r["rmse"] for r in seeds])
            mae, mae_spread = mean_spread([r["mae"] for r in seeds])
            rows.append({
                "scenario": scenario, "model": model, "method": method, "rmse": rmse, "mae": mae,
                "mase": sum(r["mase"] for r in seeds) / len(seeds),
                "rmse_spread": rmse_spread, "mae_spread": mae_spread,
                "absence_rate": sum(r["absence_rate"] for r in seeds) / len(seeds),
            })
        for scenario in SCENARIOS:
            fpr = {seed: by[model, seed, "fpr", "fpr"]["rmse"] for seed in cfg["seeds"]}
            drop = {seed: by[model, seed, scenario, "drop"]["rmse"] - fpr[seed] for seed in cfg["seeds"]}
            for method in TWINS[1:]:
                gap = {seed: by[model, seed, scenario, method]["rmse"] - fpr[seed] for seed in cfg["seeds"]}
                comparison.append({
                    "scenario": scenario, "model": model, "method": method,
                    "gap_to_fpr": sum(gap.values()) / len(gap), "drop_gap_to_fpr": sum(drop.values()) / len(drop),
                    "seeds_closer_than_drop": sum(abs(gap[s]) < abs(drop[s]) for s in cfg["seeds"]),
                    "seeds": len(cfg["seeds"]),
                })
    clients = site_clients(cfg["lookback"], cfg["horizon"], cfg["stride"], cfg["val_stride"])
    return {
        "rows": rows, "comparison": comparison, "verdicts": verdicts(comparison), "anchors": anchor_scores(clients),
        "config": {**cfg, "mode": mode, "wall_seconds": round(seconds, 1), "cpu_count": os.cpu_count(),
                   "commit": commit()},
        "runs": sorted(runs, key=lambda r: (r["model"], r["scenario"], r["method"], r["seed"])),
    }


def verdicts(comparison: list[dict]) -> list[dict]:
    """Per scenario: mean RMSE gap to FPR of drop and of each twin over the models, and in how
    many (model, twin) pairs the twin's gap is the smaller one."""
    out = []
    for scenario in SCENARIOS:
        rows = [c for c in comparison if c["scenario"] == scenario]
        models = {c["model"]: c["drop_gap_to_fpr"] for c in rows}
        gaps = {"drop": sum(models.values()) / len(models)}
        for method in TWINS[1:]:
            mine = [c["gap_to_fpr"] for c in rows if c["method"] == method]
            gaps[method] = sum(mine) / len(mine)
        closer = sum(abs(c["gap_to_fpr"]) < abs(c["drop_gap_to_fpr"]) for c in rows)
        out.append({"scenario": scenario, "mean_gap_to_fpr": gaps, "twin_closer_pairs": closer, "pairs": len(rows)})
    return out


def markdown(summary: dict) -> str:
    """Table 1 layout (RMSE and MAE mean +- spread), then the closer-to-FPR verdicts."""
    seeds = len(summary["config"]["seeds"])
    lines = [
        "Mean RMSE gap to full participation (FPR), over models; smaller is closer to FPR:",
        "", "| scenario | drop | stale | maf | wsf | twin closer than drop |", "|---|---|---|---|---|---|",
    ]
    for v in summary["verdicts"]:
        gaps = " | ".join(f"{v['mean_gap_to_fpr'][m]:+.4f}" for m in TWINS)
        lines.append(f"| {v['scenario'].upper()} | {gaps} | {v['twin_closer_pairs']}/{v['pairs']} (model, twin) pairs |")
    lines += [
        "",
        f"RMSE / MAE of the global model after the last round, mean +- half-range over {seeds} seeds.",
        "", "| scenario | model | method | RMSE | MAE | MASE |", "|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['model']} | {r['method']} | {r['rmse']:.4f} +- {r['rmse_spread']:.4f} | "
            f"{r['mae']:.4f} +- {r['mae_spread']:.4f} | {r['mase']:.4f} |"
        )
    lines += ["", "The same clients' test windows forecast by the anchors (no training, no fleet):", "",
              *anchor_lines(summary["anchors"])]
    lines += [
        "", "Gap to FPR (RMSE of the method minus RMSE of full participation, same seed), twins vs FedAvg-drop:",
        "", "| scenario | model | twin | twin gap | drop gap | seeds closer than drop |", "|---|---|---|---|---|---|",
    ]
    for c in summary["comparison"]:
        lines.append(
            f"| {c['scenario']} | {c['model']} | {c['method']} | {c['gap_to_fpr']:+.4f} | "
            f"{c['drop_gap_to_fpr']:+.4f} | {c['seeds_closer_than_drop']}/{c['seeds']} |"
        )
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Global NRMSE per round, one panel per (model, scenario), methods averaged over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cfg = summary["config"]
    curves: dict[tuple, list[list[float]]] = {}
    for r in summary["runs"]:
        curves.setdefault((r["model"], r["scenario"], r["method"]), []).append(r["nrmse_curve"])
    fig, axes = plt.subplots(
        len(cfg["models"]), len(SCENARIOS), figsize=(3.6 * len(SCENARIOS), 2.8 * len(cfg["models"])),
        squeeze=False, sharex=True,
    )
    for row, model in zip(axes, cfg["models"]):
        for ax, scenario in zip(row, SCENARIOS):
            for key, label in [(("fpr", "fpr"), "FPR")] + [((scenario, m), m) for m in TWINS]:
                runs = curves[(model, *key)]
                mean = [sum(values) / len(values) for values in zip(*runs)]
                ax.plot(range(1, len(mean) + 1), mean, label=label, linestyle="--" if label == "FPR" else "-")
            ax.set(title=f"{model} / {scenario.upper()}", xlabel="round", ylabel="global NRMSE")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "short runs (under 10 minutes on 2 cores)")
    parser.add_argument("--models", nargs="+", help="subset of backbones to run")
    parser.add_argument("--rounds", type=int, help="override the number of rounds")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the seeds")
    parser.add_argument("--personal-epochs", type=int, help="FedRep-style personal phase of every client (epochs)")
    parser.add_argument("--report-only", action="store_true", help="re-render the report from --out/feddtw.json")
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    overrides = {"models": args.models, "rounds": args.rounds, "seeds": args.seeds, "personal_epochs": args.personal_epochs}
    cfg.update({k: v for k, v in overrides.items() if v})
    if args.report_only:
        previous = json.loads((args.out / "feddtw.json").read_text())
        config = previous["config"]
        summary = summarize(previous["runs"], config, config["mode"], config["wall_seconds"])
        write_report(args.out, "feddtw", summary, markdown, plot)
        return
    started = time.perf_counter()
    runs = run_parallel(
        run_job, jobs(cfg), args.workers,
        lambda r: f"{r['model']:>8} seed {r['seed']} {r['scenario']:>4} {r['method']:<5} "
        f"RMSE {r['rmse']:.4f} MAE {r['mae']:.4f} ({r['seconds']:.0f} s)",
    )
    summary = summarize(runs, cfg, "quick" if args.quick else "full", time.perf_counter() - started)
    write_report(args.out, "feddtw", summary, markdown, plot)

if __name__ == "__main__":
    main()
