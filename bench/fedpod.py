"""FedPoD on the seven weather stations: 12 hours from 12 hours (paper Table 1 layout).

Variants: (a) the foundation architecture trained from scratch with FedAvg, (b) the pretrained
foundation model fine-tuned with FedAvg, (c) pretrained + prompts with FedAvg, (d) full FedPoD
(prompts, eq. 6 loss, dynamic graph personalization), and beside them each station's anchor of
choice on validation (seasonal naive, window average, ETS, Theta fitted on its own history: what
it gets for free). Task 1 forecasts temp_air from all variables, task 2 all variables. Reported per variant and task: trainable parameters per
client, bytes each client uploads per round, and test MAE/RMSE (standardized scale, mean over
stations). Usage:

    python bench/fedpod.py --quick      # minutes on 2 cores
    python bench/fedpod.py              # more rounds and denser windows
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from common import bench_parser, configure, run_config, run_parallel, save_figure, write_report

QUICK = {"rounds": 4, "local_epochs": 1, "stride": 6, "pretrain_rounds": 5, "pretrain_stride": 3, "seed": 42,
         "seeds": [1, 2, 3]}
FULL = {"rounds": 10, "local_epochs": 5, "stride": 1, "pretrain_rounds": 20, "pretrain_stride": 1, "seed": 42,
        "seeds": [1, 2, 3]}
VARIANTS = ("scratch_fedavg", "finetune_fedavg", "prompts_fedavg", "fedpod")
TASKS = {"task1": "single", "task2": "multivariate"}


@functools.lru_cache(maxsize=1)
def foundation(pretrain_rounds: int, stride: int, seed: int):
    """The pretrained foundation model, built once per worker (seeded, so identical everywhere)."""
    from coordinator.simulation.pretrain import pretrain
    from coordinator.simulation.pretrain_config import PretrainConfig
    from edge_agent.data import load_sites
    from edge_agent.data.canonical import device_series
    from edge_agent.models.foundation_config import FoundationConfig

    fm = FoundationConfig()
    devices = [device_series(t, fm.variables, fm.window, stride) for t in load_sites()]
    return pretrain(devices, fm, PretrainConfig(rounds=pretrain_rounds, stride=stride, seed=seed))[0]


def run_job(variant: str, task: str, seed: int, cfg: dict, threads: int) -> dict:
    """One variant on one task with one fine-tuning seed (the foundation model is the same); the
    ``anchor`` variant needs no seed."""
    import torch

    if variant == "anchor":
        return anchor_job(task, cfg, threads)
    from coordinator.simulation.prompts import PromptFederationConfig, mean_scores, run_prompt_federation
    from edge_agent.data import load_sites
    from edge_agent.learners.foundation import foundation_model
    from edge_agent.models.prompt_settings import PromptConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    pretrained = foundation(cfg["pretrain_rounds"], cfg["pretrain_stride"], cfg["seed"])
    if variant == "scratch_fedavg":
        pretrained = foundation_model(pretrained.cfg, seed)
    fed = PromptFederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], stride=cfg["stride"],
                                 seed=seed, strategy="fedpod" if variant == "fedpod" else "fedavg")
    learners, curve = run_prompt_federation(load_sites(), pretrained, PromptConfig(task=TASKS[task]), fed,
                                            tune_foundation=variant in ("scratch_fedavg", "finetune_fedavg"))
    mae, rmse = mean_scores(learners, "test")
    trainable = sum(p.numel() for p in learners[0].model.parameters() if p.requires_grad)
    return {
        "variant": variant, "task": task, "seed": seed, "trainable_params": trainable,
        "bytes_per_round": sum(t.numel() * t.element_size() for t in learners[0].wire_state(1).values()),
        "mae": mae, "rmse": rmse, "val_curve": [r.rmse for r in curve], "seconds": time.perf_counter() - started,
    }


def anchor_job(task: str, cfg: dict, threads: int) -> dict:
    """Each station's anchor of choice (lowest validation MAE), fitted on its own training rows, on the
    very windows the prompt models forecast (the last 12 hours of each 24-hour window), on the same
    standardized scale: task 1 its temp_air, task 2 every variable it measures."""
    import numpy as np

    from common import ANCHORS
    from edge_agent.anchors import make_anchor
    from edge_agent.data import load_sites, prepare_client
    from edge_agent.models.prompt_settings import PromptConfig

    started, prompt = time.perf_counter(), PromptConfig(task=TASKS[task])
    scores, chosen = [], {}
    for table in load_sites():
        data = prepare_client(table, prompt.lookback + prompt.horizon, 1, cfg["stride"], val_stride=cfg["stride"])
        columns = [table.columns.index(prompt.target)] if prompt.task == "single" else list(range(table.n_features))

        def errors(name: str, split: str) -> np.ndarray | None:
            anchor = make_anchor(name, data.period)
            windows = getattr(data, split)
            origins = windows.origins() - prompt.horizon  # a window's last 12 rows end where its origin() starts
            if len(data.history) < anchor.min_history or origins.min() < anchor.min_history:
                return None
            forecast = anchor.fit(data.history).forecast(data.raw, origins, prompt.horizon)
            target = data.raw[origins[:, None] + np.arange(prompt.horizon)]
            return ((forecast - target) / data.scaler.std)[..., columns]

        val = {name: e for name in ANCHORS if (e := errors(name, "val")) is not None}
        best = min(val, key=lambda name: np.abs(val[name]).mean())
        test = errors(best, "test")
        scores.append((float(np.abs(test).mean()), float(np.sqrt((test ** 2).mean()))))
        chosen[table.name] = best
    return {"variant": "anchor", "task": task, "seed": None, "trainable_params": 0, "bytes_per_round": 0,
            "mae": float(np.mean([s[0] for s in scores])), "rmse": float(np.mean([s[1] for s in scores])),
            "val_curve": [], "chosen": chosen, "seconds": time.perf_counter() - started}


def markdown(summary: dict) -> str:
    seeds = len(summary["config"]["seeds"])
    lines = [f"Test MAE / RMSE (standardized), mean +- half-range over {seeds} fine-tuning seeds.", "",
             "| variant | task | trainable params | bytes / client / round | MAE | RMSE |", "|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['variant']} | {r['task']} | {r['trainable_params']:,} | {r['bytes_per_round']:,} | "
                     f"{r['mae']:.4f} +- {r['mae_spread']:.4f} | {r['rmse']:.4f} +- {r['rmse_spread']:.4f} |")
    return "\n".join(lines) + "\n"


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (variant, task): means over seeds and half the range."""
    rows = []
    for task in TASKS:
        for variant in (*VARIANTS, "anchor"):
            mine = [r for r in runs if r["variant"] == variant and r["task"] == task]
            row = {k: mine[0][k] for k in ("variant", "task", "trainable_params", "bytes_per_round")}
            for metric in ("mae", "rmse"):
                values = [r[metric] for r in mine]
                row[metric], row[f"{metric}_spread"] = sum(values) / len(values), (max(values) - min(values)) / 2
            row["val_curve"] = [sum(v) / len(v) for v in zip(*(r["val_curve"] for r in mine))] if mine[0]["val_curve"] else []
            rows.append(row)
    return rows


def plot(summary: dict, path: Path) -> None:
    """Validation RMSE per round (mean over seeds), per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(9, 3.2), squeeze=False)
    for ax, task in zip(axes[0], TASKS):
        for r in (r for r in summary["rows"] if r["task"] == task):
            ax.plot(range(1, len(r["val_curve"]) + 1), r["val_curve"], marker="o", label=r["variant"])
        ax.set(title=task, xlabel="round", ylabel="validation RMSE (standardized)")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "few rounds, sparse windows (minutes on 2 cores)"), QUICK, FULL)
    jobs = [(v, t, s, cfg) for t in TASKS for v in VARIANTS for s in cfg["seeds"]] + [("anchor", t, None, cfg)
                                                                                      for t in TASKS]
    runs = run_parallel(run_job, jobs, args.workers,
                        lambda r: f"{r['variant']:>16} {r['task']} seed {r['seed']}: MAE {r['mae']:.4f} "
                        f"RMSE {r['rmse']:.4f} ({r['seconds']:.0f} s)")
    summary = {"rows": summarize(runs), "runs": runs, "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "fedpod", summary, markdown, plot)


if __name__ == "__main__":
    main()
