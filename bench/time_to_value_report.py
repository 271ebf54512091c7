"""The rows, table and figure of bench/time_to_value.py: per dataset and day after joining, the
mean MASE of what a joining gateway serves and of what it serves alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from common import panel_row, save_figure



def summarize(newcomers: list[dict], split: str, cfg: dict) -> list[dict]:
    """One row per (dataset, day) and one per dataset over every day (``day`` "1-30", or "1-D"
    where the dataset ends D < 30 days after the sites join): joined and alone MASE averaged over
    the joining sites and seeds, the gain, the seeds' half-range of the gain and how many (site,
    seed) runs joining wins."""
    rows = []
    for dataset in cfg["datasets"]:
        joining = [n for n in newcomers if n["dataset"] == dataset]
        runs = [(n["client"], run) for n in joining for run in n["runs"]]
        days = list(range(1, min(n.get("days", cfg["days"]) for n in joining) + 1))
        rows += [row(split, dataset, day, runs, [day], cfg["seeds"]) for day in days]
        rows.append(row(split, dataset, f"1-{days[-1]}", runs, days, cfg["seeds"]))
    return rows


def row(split: str, dataset: str, day, runs: list[tuple[str, dict]], days: list[int], seeds: list[int]) -> dict:
    """Joined and alone over ``days`` of every run (a site and a seed) that scored one of them: a
    day whose outcomes miss values (a logger's gap) has no score and counts for no run."""
    def mean(run: dict, side: str) -> float:
        scores = np.array([run[side][d - 1]["mase"] for d in days], dtype=float)
        return float(np.nanmean(scores)) if np.isfinite(scores).any() else math.nan

    scored = [(site, run) for site, run in runs if math.isfinite(mean(run, "joined")) and math.isfinite(mean(run, "alone"))]
    joined = np.array([mean(run, "joined") for _, run in scored])
    alone = np.array([mean(run, "alone") for _, run in scored])
    per_seed = [1 - joined[seed].mean() / alone[seed].mean()
                for seed in ([r["seed"] == s for _, r in scored] for s in seeds) if any(seed)]
    return {"split": split, "dataset": dataset, "day": day, "joined": float(joined.mean()), "alone": float(alone.mean()),
            "gain": float(1 - joined.mean() / alone.mean()), "gain_seed_half_range": float(np.ptp(per_seed) / 2),
            "wins": int((joined < alone).sum()), "runs": len(scored)}


def markdown(summary: dict) -> str:
    """Days 1, 3, 7, 14 and 30 and the mean over every day (1-30, or fewer where a dataset ends) per dataset."""
    shown = summary["config"]["report_days"]
    recomputed = f"; rows from its stored scores at {summary['rows_commit'][:12]}" if "rows_commit" in summary else ""
    lines = [f"Time to value ({summary['split']} datasets; commit {summary['config']['commit'][:12]}{recomputed}, "
             f"{summary['config']['mode']} mode, seeds {summary['config']['seeds']}): MASE of what a joining "
             "gateway serves, joined and alone, mean over its sites and seeds.", "",
             "| dataset | day | joined | alone | gain | seeds ± | runs joining wins |", "|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        if r["day"] in shown or isinstance(r["day"], str):
            lines.append(f"| {r['dataset']} | {r['day']} | {r['joined']:.4f} | {r['alone']:.4f} | {r['gain']:+.1%} | "
                         f"{r['gain_seed_half_range']:.1%} | {r['wins']}/{r['runs']} |")
    cpu = summary["cpu_seconds_per_round_per_gateway"]
    lines += ["", "CPU seconds per round per gateway (the established fleet's FedAvg rounds, seeds' mean): "
              + ", ".join(f"{d} {np.mean(v):.1f}" for d, v in cpu.items()), ""]
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """MASE by day after joining, joined and alone, one panel per dataset."""
    datasets = list(dict.fromkeys(r["dataset"] for r in summary["rows"]))
    fig, axes = panel_row(len(datasets), 3.6)
    for ax, dataset in zip(axes, datasets):
        rows = [r for r in summary["rows"] if r["dataset"] == dataset and isinstance(r["day"], int)]
        days = [r["day"] for r in rows]
        ax.plot(days, [r["joined"] for r in rows], label="joined", color="tab:blue")
        ax.plot(days, [r["alone"] for r in rows], label="alone", color="tab:gray", linestyle="--")
        ax.set_title(dataset, fontsize=9)
        ax.set_xlabel("day after joining")
        ax.set_ylabel("MASE")
        ax.legend(fontsize=8)
    save_figure(fig, path)
