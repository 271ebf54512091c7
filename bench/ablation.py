"""What each change of the recipe bought: the value benchmark's old setting, then one change at a time.

The steps are cumulative, in this order (an ablation in another order would split the gains
differently where changes interact): the benchmark's old setting (QAP with d = 32, FedPer's
personal head, L = 48, MSE, at most 96 training windows per client, 6 epochs or rounds); a
channel-independent model (every feature its own sequence, d = 1); every training window and 10
epochs or rounds; at least 64 optimizer steps a round (more passes over a short history); a week
of lookback; the MAE loss; the seasonal base; the head shared by the fleet (the recipe,
``ModelConfig()``); and what the product serves (bench/value.py's ``served``: each gateway's two
best candidates among FedAvg, Local-only, the anchors and their median, their mean where near
equal, re-chosen daily by ``edge_agent.choice``). Local-only and FedAvg at K = 30 days and the
full history, one seed, the three datasets of bench/value.py, test MASE on the value benchmark's
scale. Usage:

    python bench/ablation.py --quick     # one seed (about 30 min on 2 cores)
    python bench/ablation.py             # three seeds
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from common import bench_parser, capped_stride, configure, panel_row, run_config, run_parallel, save_figure, write_report
from datasets import bench_fleet

import value

OLD = {"lookback": 48, "d_qap": 32, "qap_heads": 4, "projection": "qap", "head": "personal", "seasonal_base": False,
       "loss": "mse"}
STEPS = [
    ("old setting", OLD, {"max_windows": 96, "rounds": 6, "min_steps": 0}),
    ("channel-independent", {"projection": "channel", "d_qap": 1, "qap_heads": 1}, {}),
    ("every window, 10 epochs", {}, {"max_windows": None, "rounds": 10}),
    (">= 64 steps a round", {}, {"min_steps": 64}),
    ("lookback 168", {"lookback": 168}, {}),
    ("MAE loss", {"loss": "mae"}, {}),
    ("seasonal base", {"seasonal_base": True}, {}),
    ("shared head (the recipe)", {"head": "shared"}, {}),
]
QUICK = {"datasets": ["stations", "homes", "pedestrians"], "history_days": [30, 0], "seeds": [1], "clients": 10,
         "f_max": 20, "val_stride": 1, "local_epochs": 1, "personal_epochs": 1,
         "anchors": value.QUICK["anchors"],  # the recipe's, as in bench/value.py
         "learned": ["local", "fedavg"], "backbones": ["dlinear"]}
FULL = {**QUICK, "seeds": [1, 2, 3]}
SERVED_CHANGE = "served: what the product serves (bench/value.py's served, re-chosen daily)"


def step_settings(step: int) -> tuple[dict, dict]:
    """The model overrides and training settings in force after ``step`` cumulative changes."""
    model, training = {}, {}
    for _, model_change, training_change in STEPS[: step + 1]:
        model.update(model_change)
        training.update(training_change)
    return model, training


def run_job(dataset: str, days: int, step: int | None, method: str | None, seed: int | None, cfg: dict,
            threads: int) -> dict:
    """One anchor (``step`` None), one method at an earlier step, or at the last step (the recipe)
    bench/value.py's job: Local-only, FedAvg and their median with the anchors."""
    last = len(STEPS) - 1
    if step is None or step == last:
        training = {**cfg, **step_settings(last)[1]}
        result = value.run_job(dataset, days, None if step is None else "dlinear", method, seed, training, threads)
        return {"runs": [{**run, "step": step, "backbone": None if step is None else f"step{step}"}
                         for run in result["runs"]]}
    return {"runs": [learned_step(dataset, days, step, method, seed, cfg, threads)]}


def learned_step(dataset: str, days: int, step: int, method: str, seed: int, cfg: dict, threads: int) -> dict:
    """One learned method with the model and training settings in force after ``step`` changes."""
    import torch

    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    model, training = step_settings(step)
    recipe = ModelConfig(**model)
    rows = days * 24 if days else _full_rows(dataset, recipe.lookback, recipe.horizon)
    stride = 1 if training.get("max_windows") is None else capped_stride(rows, recipe.lookback, recipe.horizon,
                                                                          training["max_windows"])
    fleet = bench_fleet(dataset, days, recipe.lookback, recipe.horizon, stride, cfg["val_stride"], cfg["clients"],
                        cfg["f_max"])
    per_client = value.learned(fleet, recipe, method, seed, {**cfg, "rounds": training["rounds"],
                                                             "min_steps": training["min_steps"]})
    return {"dataset": dataset, "history_days": days, "backbone": f"step{step}", "step": step, "method": method,
            "seed": seed, "clients": per_client, "seconds": time.perf_counter() - started}


def _full_rows(dataset: str, lookback: int, horizon: int) -> int:
    """Rows of the whole training split: every dataset here is one year of hourly rows."""
    from edge_agent.data import split_bounds

    return split_bounds(365 * 24, lookback, horizon)["train"][1]


def jobs(cfg: dict) -> list[tuple]:
    cells = [(d, k) for d in cfg["datasets"] for k in cfg["history_days"]]
    last = len(STEPS) - 1
    anchors = [(d, k, None, a, None, cfg) for d, k in cells for a in cfg["anchors"]]
    recipe = [(d, k, last, None, s, cfg) for d, k in cells for s in cfg["seeds"]]
    return anchors + recipe + [(d, k, step, m, s, cfg) for d, k in cells for step in range(last)
                               for m in cfg["learned"] for s in cfg["seeds"]]


def table(runs: list[dict], cfg: dict) -> list[dict]:
    """Mean test MASE over clients and seeds per (dataset, K, step, method), the served row of the
    last step and the best anchor."""
    import numpy as np

    last = f"step{len(STEPS) - 1}"
    rows = []
    for dataset in cfg["datasets"]:
        for days in cfg["history_days"]:
            cell = [r for r in runs if (r["dataset"], r["history_days"]) == (dataset, days)]
            mean = lambda group: float(np.mean([np.mean([c["mase"] for c in r["clients"].values()]) for r in group]))
            anchors = {r["method"]: mean([r]) for r in cell if r["step"] is None}
            best = min(anchors, key=anchors.__getitem__)
            for step, (name, _, _) in enumerate(STEPS):
                row = {"dataset": dataset, "history_days": days, "step": step, "change": name}
                for method in cfg["learned"] + ["median"]:
                    runs_of = [r for r in cell if (r["step"], r["method"]) == (step, method)]
                    if runs_of:
                        row[method] = mean(runs_of)
                rows.append(row)
            served = [r for r in cell if (r["backbone"], r["method"]) == (last, value.SERVED)]
            rows.append({"dataset": dataset, "history_days": days, "step": len(STEPS), "change": SERVED_CHANGE,
                         "served": mean(served),
                         "best_anchor": best, "best_anchor_mase": anchors[best]})
    return rows


def markdown(summary: dict) -> str:
    learned = summary["config"]["learned"] + ["median"]
    lines = ["Test MASE, mean over clients (and seeds); each step adds one change to the one above.", "",
             "| dataset | K days | step | " + " | ".join(learned) + " | served | best anchor |",
             "|---|---|---|" + "---|" * (len(learned) + 2)]
    for r in summary["rows"]:
        cells = [f"{r[m]:.4f}" if m in r else "" for m in learned]
        served = f"{r['served']:.4f}" if "served" in r else ""
        anchor = f"{r['best_anchor']} {r['best_anchor_mase']:.4f}" if "best_anchor" in r else ""
        lines.append(f"| {r['dataset']} | {r['history_days'] or 'full'} | {r['change']} | " + " | ".join(cells)
                     + f" | {served} | {anchor} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """Local-only and FedAvg MASE per step, one panel per (dataset, K), the best anchor dashed."""
    cfg = summary["config"]
    panels = [(d, k) for d in cfg["datasets"] for k in cfg["history_days"]]
    fig, axes = panel_row(len(panels), 3.4)
    for ax, (dataset, days) in zip(axes, panels):
        rows = [r for r in summary["rows"] if (r["dataset"], r["history_days"]) == (dataset, days)]
        steps = [r for r in rows if "served" not in r]
        for method in cfg["learned"]:
            ax.plot(range(len(steps)), [r[method] for r in steps], marker="o", label=method)
        last = rows[-1]
        ax.axhline(last["best_anchor_mase"], linestyle="--", color="grey", label=f"best anchor ({last['best_anchor']})")
        ax.plot([len(steps) - 1], [last["served"]], marker="*", markersize=12, linestyle="none", label="served")
        ax.set(title=f"{dataset}, K={days or 'full'}", xlabel="step", ylabel="test MASE")
        ax.legend(fontsize=6)
    save_figure(fig, path)


def describe(result: dict) -> str:
    """One line per finished job: each method's fleet MASE."""
    return "; ".join(f"{r['dataset']:>11} K={r['history_days'] or 'full':>4} step {r['step']} {r['method']:>19}: "
                     f"MASE {sum(c['mase'] for c in r['clients'].values()) / len(r['clients']):.4f} "
                     f"({r['seconds']:.0f} s)" for r in result["runs"])


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "one seed (about 30 min on 2 cores)"), QUICK, FULL)
    with tempfile.TemporaryDirectory() as cache:
        os.environ[value.ANCHOR_CACHE] = cache  # the anchors' forecasts, shared with the recipe's medians
        results = run_parallel(run_job, jobs(cfg), args.workers, describe)
    runs = [run for result in results for run in result["runs"]]
    summary = {"rows": table(runs, cfg), "steps": [name for name, _, _ in STEPS],
               "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "ablation", summary, markdown, plot)


if __name__ == "__main__":
    main()
