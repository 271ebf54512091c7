"""Firing rates the spiking backbones reach with the default recipe, and the forecast error they
buy beside the ANN's and the anchors' (issue 30, point 4).

Each job is ``edgefl simulate``'s federation with every model and training option at its default
(the recipe: ModelConfig, AgentTraining and FederationConfig defaults), only the fleet and the
number of rounds set here, for DLinear (the ANN) and the two spiking backbones, per seed. Per
job: every LIF layer's firing rate on the clients' test windows (``edgefl.simulate_cli``'s
``fleet_firing_rates``, mean over clients), the federated model's test MASE/MSE at its best
round (by validation) and what the gateways serve. The anchors are fitted on each client's own
history and scored on the same test windows. Usage:

    python bench/firing.py --quick     # 3 clients, 14 days of history, 2 rounds, 2 seeds
    python bench/firing.py             # 5 clients, the whole year, 10 rounds, 3 seeds
"""

from __future__ import annotations

import time
from pathlib import Path

from common import anchor_lines, anchor_scores, bench_parser, configure, run_config, run_parallel, save_figure, \
    write_report

QUICK = {"backbones": ["dlinear", "spikernn", "ispikformer"], "seeds": [1, 2], "clients": 3, "f_max": 5,
         "history_days": 14, "rounds": 2}
FULL = {**QUICK, "seeds": [1, 2, 3], "clients": 5, "history_days": None, "rounds": 10}
RATE_FLOOR = 0.005  # a layer under this carries almost nothing: called out in the report


def fleet_for(cfg: dict, seed: int):
    """The clients ``edgefl simulate --clients --f-max --history-days --seed`` builds, with the
    recipe's lookback, horizon and stride."""
    from edge_agent.config import AgentTraining
    from edge_agent.data import build_pool, feature_clients, load_sites, steps_per_day
    from edge_agent.models import ModelConfig

    model, pool = ModelConfig(), build_pool(load_sites())
    history = None if cfg["history_days"] is None else cfg["history_days"] * steps_per_day(pool)
    return feature_clients(pool, cfg["clients"], cfg["f_max"], seed, model.lookback, model.horizon,
                           AgentTraining().stride, history=history)


def run_job(backbone: str, seed: int, cfg: dict, threads: int) -> dict:
    """One default-recipe federation of ``backbone``: its firing rates and test error."""
    import torch

    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.config import AgentTraining
    from edge_agent.models import ModelConfig
    from edgefl.simulate_cli import fleet_firing_rates

    torch.set_num_threads(threads)
    started = time.perf_counter()
    fleet = fleet_for(cfg, seed)
    training = AgentTraining().model_dump(exclude={"stride"})
    fed = FederationConfig(rounds=cfg["rounds"], seed=seed, **training)
    result = run_federation(fleet, ModelConfig(backbone=backbone), fed)
    served = [m.mase for m in result.client_test.values()]
    return {"backbone": backbone, "seed": seed, "test_mase": result.test.mase, "test_mse": result.test.mse,
            "best_round": result.best_round, "served_mase": sum(served) / len(served),
            "firing_rates": {k.removeprefix("shared.backbone."): v
                             for k, v in fleet_firing_rates(result.models, fleet).items()},
            "seconds": round(time.perf_counter() - started, 1)}


def summarize(runs: list[dict], cfg: dict) -> dict:
    """Per backbone: mean and half-range over seeds of the test MASE, each layer's mean rate and
    its lowest over seeds."""
    rows = []
    for backbone in cfg["backbones"]:
        mine = [r for r in runs if r["backbone"] == backbone]
        mase = [r["test_mase"] for r in mine]
        layers = list(mine[0]["firing_rates"])
        rows.append({"backbone": backbone, "test_mase": sum(mase) / len(mase),
                     "test_mase_half_range": (max(mase) - min(mase)) / 2,
                     "served_mase": sum(r["served_mase"] for r in mine) / len(mine),
                     "rates": {k: sum(r["firing_rates"][k] for r in mine) / len(mine) for k in layers},
                     "lowest_rate": {k: min(r["firing_rates"][k] for r in mine) for k in layers}})
    return {"rows": rows, "runs": runs}


def markdown(summary: dict) -> str:
    cfg = summary["config"]
    lines = [f"Default recipe, {cfg['clients']} clients, {cfg['history_days'] or 'all'} days of history, "
             f"{cfg['rounds']} rounds, seeds {cfg['seeds']}; commit {cfg['commit']}. Test MASE of the federated "
             "model at its best round (mean ± half-range over seeds), what the gateways serve, and every LIF "
             f"layer's firing rate on the test windows (mean over seeds; lowest seed in brackets; under "
             f"{RATE_FLOOR} marked).", "",
             "| backbone | test MASE | served MASE | LIF layers | lowest layer rate | layers under the floor |",
             "|---|---|---|---|---|---|"]
    for row in summary["rows"]:
        low = row["lowest_rate"]
        floor = [k for k, v in low.items() if v < RATE_FLOOR]
        lowest = f"{min(low.values()):.4f} ({min(low, key=low.get)})" if low else "-"
        lines.append(f"| {row['backbone']} | {row['test_mase']:.4f} ± {row['test_mase_half_range']:.4f} | "
                     f"{row['served_mase']:.4f} | {len(low)} | {lowest} | {', '.join(floor) or 'none'} |")
    lines += ["", *anchor_lines(summary["anchors"]), ""]
    for row in summary["rows"]:
        if row["rates"]:
            lines.append(f"{row['backbone']}: " + ", ".join(f"{k} {v:.3f} ({row['lowest_rate'][k]:.3f})"
                                                            for k, v in row["rates"].items()))
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spiking = [row for row in summary["rows"] if row["rates"]]
    fig, axes = plt.subplots(1, len(spiking), figsize=(6 * len(spiking), 4), squeeze=False)
    for ax, row in zip(axes[0], spiking):
        names = list(row["rates"])
        ax.barh(names, [row["rates"][k] for k in names], color="tab:purple")
        ax.axvline(RATE_FLOOR, color="grey", linestyle=":", label=f"floor {RATE_FLOOR}")
        ax.set_title(f"{row['backbone']}: test MASE {row['test_mase']:.3f}")
        ax.set_xlabel("firing rate (spikes per neuron per step)")
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(loc="lower right")
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "3 clients, 14 days, 2 rounds, 2 seeds")
    args, cfg, started = configure(parser, QUICK, FULL)
    jobs = [(b, s, cfg) for s in cfg["seeds"] for b in cfg["backbones"]]
    runs = run_parallel(run_job, jobs, args.workers,
                        lambda r: f"{r['backbone']:>12} seed {r['seed']}: test MASE {r['test_mase']:.4f}, "
                                  f"rates {min(r['firing_rates'].values(), default=float('nan')):.4f} lowest "
                                  f"({r['seconds']} s)")
    anchors = {seed: anchor_scores(fleet_for(cfg, seed)) for seed in cfg["seeds"]}
    mean_anchors = {name: None if any(a[name] is None for a in anchors.values()) else
                    {k: sum(a[name][k] for a in anchors.values()) / len(anchors) for k in ("mase", "mse", "mae")}
                    for name in next(iter(anchors.values()))}
    summary = {**summarize(runs, cfg), "anchors": mean_anchors, "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "firing", summary, markdown, plot)


if __name__ == "__main__":
    main()
