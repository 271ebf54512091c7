"""Fed-GAME (issue 14): quantile forecasts with personalized mixture-of-experts aggregation vs
No_FL, FedAvg and FedProx, and the aggregator ablation of the paper's Table 3.

Real multi-site data, one client per site forecasting its own series (as each charging station
of the paper's Palo Alto and Shenzhen sets, section 3): the seven bundled pvlib weather stations
(target temp_air, hourly) and the 16 CityLearn 2022 homes shipped in the CityLearn wheel on PyPI
(target load, hourly; bench/datasets.py). A day of history forecasts the next 6 and 12 hours
(the paper's horizons 6 and 12). Every method trains the same quantile model (levels 0.1, 0.5,
0.9, pinball loss; DLinear backbone under QAP, the head personal) with the same rounds, local
epochs, batch size and learning rate; No_FL is each client alone with early stopping for as many
epochs. FedProx and Fed-GAME's clients use the proximal weight mu; Fed-GAME's clients keep private
models and receive their personalized difference of the backbone's last layer (GAME: 4 experts,
top-2, Adam lr 0.0005 on the server, section 3). The ablation swaps only the server's
aggregator (GAME, GAT-style single attention, mean of the peers) at horizon 12.

Reported per (dataset, horizon, method) over seeds: test QS, ICP, MIL (Table 1) and the median's
MSE, mean and half-range; the conformal-calibrated ICP and MIL (intervals adjusted on each
client's own validation windows); bytes per client and round on the wire (update up, global
state and personal message down, as MQTT payloads); and per client, how often it beats its own
No_FL model by QS. Beside them, ``anchor``: each client's anchor of choice on validation with
split-conformal quantiles from its own validation residuals, what a gateway gets for free. Usage:

    python bench/fedgame.py --quick    # 3 seeds, 20 rounds, about 12 min on 2 cores
    python bench/fedgame.py            # more rounds, wider training sets
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from common import bench_parser, capped_stride, configure, run_config, run_parallel, save_figure, write_report

QUICK = {
    "datasets": ["stations", "homes"], "horizons": [6, 12], "seeds": [1, 2, 3], "lookback": 24, "backbone": "dlinear",
    "d_qap": 16, "qap_heads": 2, "quantiles": [0.1, 0.5, 0.9], "rounds": 20, "local_epochs": 1, "batch_size": 32,
    "lr": 3e-3, "patience": 3, "prox_mu": 0.01, "game_lr": 5e-4, "game_steps": 20, "max_windows": 512,
    "val_stride": 6, "ablation_horizon": 12,
}
FULL = {**QUICK, "rounds": 40, "max_windows": 2048, "val_stride": 1}
METHODS = ("no_fl", "fedavg", "fedprox", "fedgame", "anchor")
AGGREGATORS = ("game", "gat", "mean")
TARGETS = {"stations": "temp_air", "homes": "load"}


@functools.lru_cache(maxsize=8)
def clients(dataset: str, horizon: int, cfg_items: tuple) -> list:
    """One client per site with its target series, training windows subsampled to at most
    ``max_windows`` (validation and test windows as configured)."""
    from edge_agent.data import load_sites, prepare_client, split_bounds

    cfg = dict(cfg_items)
    if dataset == "homes":
        from datasets import citylearn_homes

        tables = citylearn_homes()
    else:
        tables = load_sites()
    tables = [t.select([TARGETS[dataset]]) for t in tables]
    rows = split_bounds(tables[0].n_rows, cfg["lookback"], horizon)["train"][1]
    stride = capped_stride(rows, cfg["lookback"], horizon, cfg["max_windows"])
    return [prepare_client(t, cfg["lookback"], horizon, stride=stride, val_stride=cfg["val_stride"]) for t in tables]


def federation(method: str, aggregator: str, seed: int, cfg: dict):
    """The FederationConfig of a federated method (and aggregator, for Fed-GAME)."""
    from coordinator.simulation.federation_config import FederationConfig
    from coordinator.strategy_settings import GameSettings

    extra = {"fedavg": {}, "fedprox": {"prox_mu": cfg["prox_mu"]},
             "fedgame": {"strategy": "fedgame", "prox_mu": cfg["prox_mu"],
                         "game": GameSettings(variant=aggregator, lr=cfg["game_lr"], steps=cfg["game_steps"])}}
    return FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"],
                            lr=cfg["lr"], seed=seed, local_patience=cfg["patience"], test_every_round=False,
                            **extra.get(method, {}))


def run_job(dataset: str, horizon: int, method: str, aggregator: str, seed: int, cfg: dict, threads: int) -> dict:
    """One method on one (dataset, horizon) with one seed: fleet and per-client test metrics. The
    ``anchor`` method is each client's best anchor on validation with split-conformal quantiles
    (``edge_agent.selection.anchor_quantile_metrics``), the same for every seed."""
    import torch

    if method == "anchor":
        return anchor_job(dataset, horizon, seed, cfg)
    from coordinator.simulation.baselines import TrainingBudget, run_local_only
    from coordinator.simulation.federation import run_federation
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    fleet = clients(dataset, horizon, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    model = ModelConfig.paper(backbone=cfg["backbone"], lookback=cfg["lookback"], horizon=horizon, d_qap=cfg["d_qap"],
                        qap_heads=cfg["qap_heads"], quantiles=tuple(cfg["quantiles"]))
    fed = federation(method, aggregator, seed, cfg)
    if method == "no_fl":
        result, wire = run_local_only(fleet, model, TrainingBudget.matching(fed)), 0.0
    else:
        result = run_federation(fleet, model, fed)
        wire = sum(r.wire_bytes for r in result.records) / len(result.records)
    test = result.test
    return {"dataset": dataset, "horizon": horizon, "method": method, "aggregator": aggregator, "seed": seed,
            "qs": test.qs, "icp": test.icp, "mil": test.mil, "mse": test.mse, "icp_conformal": test.icp_conformal,
            "mil_conformal": test.mil_conformal, "bytes_per_round": wire,
            "client_qs": {name: m.qs for name, m in result.client_test.items()},
            "seconds": time.perf_counter() - started}


def anchor_job(dataset: str, horizon: int, seed: int, cfg: dict) -> dict:
    """Each client's anchor of choice (lowest validation MASE) with conformal quantiles on the same windows."""
    from common import ANCHORS
    from edge_agent.selection import anchor_quantile_metrics, best_anchor
    from edge_agent.train import weighted_metrics

    started = time.perf_counter()
    fleet = clients(dataset, horizon, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    per_client = {c.name: anchor_quantile_metrics(c, best_anchor(c, ANCHORS).which, cfg["quantiles"]) for c in fleet}
    test = weighted_metrics(list(per_client.values()), [c.n_train for c in fleet])
    return {"dataset": dataset, "horizon": horizon, "method": "anchor", "aggregator": "game", "seed": seed,
            "qs": test.qs, "icp": test.icp, "mil": test.mil, "mse": test.mse, "icp_conformal": test.icp,
            "mil_conformal": test.mil, "bytes_per_round": 0.0,
            "client_qs": {name: m.qs for name, m in per_client.items()}, "seconds": time.perf_counter() - started}


def jobs(cfg: dict) -> list[tuple]:
    """Every method at every horizon (Fed-GAME with the GAME aggregator), plus the other two
    aggregators at the ablation horizon."""
    main = [(d, h, m, "game", s, cfg) for d in cfg["datasets"] for h in cfg["horizons"] for m in METHODS
            for s in cfg["seeds"]]
    ablation = [(d, cfg["ablation_horizon"], "fedgame", a, s, cfg) for d in cfg["datasets"] for a in AGGREGATORS[1:]
                for s in cfg["seeds"]]
    return main + ablation


def spread(values: list[float]) -> tuple[float, float]:
    """Mean and half-range."""
    return sum(values) / len(values), (max(values) - min(values)) / 2


def summarize(runs: list[dict], keys: tuple[str, ...], metrics: tuple[str, ...]) -> list[dict]:
    """Mean and half-range of ``metrics`` over seeds per ``keys`` group, with the client runs that
    beat their own No_FL model by QS (same dataset, horizon and seed)."""
    alone = {(r["dataset"], r["horizon"], r["seed"]): r["client_qs"] for r in runs if r["method"] == "no_fl"}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    rows = []
    for key, group in groups.items():
        row = dict(zip(keys, key))
        for metric in metrics:
            row[metric], row[f"{metric}_spread"] = spread([r[metric] for r in group])
        pairs = [(r["client_qs"][c], alone[r["dataset"], r["horizon"], r["seed"]][c]) for r in group
                 for c in r["client_qs"]]
        row["clients_better_than_no_fl"], row["client_runs"] = sum(mine < theirs for mine, theirs in pairs), len(pairs)
        rows.append(row)
    return rows


def report(runs: list[dict], cfg: dict) -> dict:
    main = [r for r in runs if r["aggregator"] == "game"]
    ablation = [r for r in runs if r["method"] in ("fedgame", "no_fl") and r["horizon"] == cfg["ablation_horizon"]]
    metrics = ("qs", "icp", "mil", "mse", "icp_conformal", "mil_conformal", "bytes_per_round")
    rows = summarize(main, ("dataset", "horizon", "method"), metrics)
    aggregators = [row for row in summarize(ablation, ("dataset", "method", "aggregator", "horizon"),
                                            ("qs", "icp", "mil")) if row["method"] == "fedgame"]
    runs_out = [{k: v for k, v in r.items() if k != "client_qs"} for r in runs]
    return {"rows": rows, "ablation": aggregators, "runs": runs_out}


def markdown(summary: dict) -> str:
    lines = ["Test metrics on each client's training-split scale, mean ± half-range over seeds "
             f"{summary['config']['seeds']}. ICP should approach 0.8 (levels 0.1-0.9); QS, MIL, MSE lower is better. "
             "'conf.' = split-conformal intervals calibrated on each client's own validation windows; 'beat No_FL' = "
             "client runs whose QS beats that client's own No_FL model.", "",
             "| dataset | horizon | method | QS | ICP | MIL | MSE | ICP conf. | MIL conf. | kB/client/round | beat No_FL |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(f"| {r['dataset']} | {r['horizon']} | {r['method']} | {r['qs']:.4f} ± {r['qs_spread']:.4f} | "
                     f"{r['icp']:.3f} ± {r['icp_spread']:.3f} | {r['mil']:.4f} | {r['mse']:.4f} | "
                     f"{r['icp_conformal']:.3f} | {r['mil_conformal']:.4f} | {r['bytes_per_round'] / 1e3:.1f} | "
                     f"{r['clients_better_than_no_fl']}/{r['client_runs']} |")
    lines += ["", f"Aggregator ablation (Fed-GAME, horizon {summary['config']['ablation_horizon']}, Table 3):", "",
              "| dataset | aggregator | QS | ICP | MIL | beat No_FL |", "|---|---|---|---|---|---|"]
    for r in summary["ablation"]:
        lines.append(f"| {r['dataset']} | {r['aggregator']} | {r['qs']:.4f} ± {r['qs_spread']:.4f} | "
                     f"{r['icp']:.3f} ± {r['icp_spread']:.3f} | {r['mil']:.4f} | "
                     f"{r['clients_better_than_no_fl']}/{r['client_runs']} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """QS (bars, half-range whiskers) and ICP (dots, nominal 0.8 dashed) per method, one panel
    per (dataset, horizon)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["dataset"], r["horizon"]) for r in summary["rows"]})
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.2), squeeze=False)
    for ax, (dataset, horizon) in zip(axes[0], panels):
        rows = {r["method"]: r for r in summary["rows"] if (r["dataset"], r["horizon"]) == (dataset, horizon)}
        names = [m for m in METHODS if m in rows]
        ax.bar(names, [rows[m]["qs"] for m in names], yerr=[rows[m]["qs_spread"] for m in names], color="tab:blue")
        lowest = min(rows[m]["qs"] - rows[m]["qs_spread"] for m in names)
        ax.set_ylim(lowest * 0.95, max(rows[m]["qs"] + rows[m]["qs_spread"] for m in names) * 1.02)
        ax.set(title=f"{dataset}, horizon {horizon}", ylabel="test QS")
        ax.tick_params(axis="x", labelsize=7)
        coverage = ax.twinx()
        coverage.plot(names, [rows[m]["icp"] for m in names], "o", color="tab:red", label="ICP")
        coverage.plot(names, [rows[m]["icp_conformal"] for m in names], "x", color="tab:green", label="ICP conformal")
        coverage.axhline(0.8, color="tab:red", linestyle="--", linewidth=0.8)
        coverage.set(ylim=(0.5, 0.95), ylabel="ICP")
        coverage.legend(fontsize=6, loc="lower right")
    save_figure(fig, path)


def main() -> None:
    args, cfg, started = configure(bench_parser(__doc__, "3 seeds, 20 rounds (about 12 min on 2 cores)"), QUICK, FULL)
    runs = run_parallel(run_job, jobs(cfg), args.workers,
                        lambda r: f"{r['dataset']:>8} h={r['horizon']:>2} {r['method']:>7}/{r['aggregator']:<4} "
                                  f"seed {r['seed']}: QS {r['qs']:.4f} ICP {r['icp']:.3f} ({r['seconds']:.0f} s)")
    summary = {**report(runs, cfg), "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "fedgame", summary, markdown, plot)


if __name__ == "__main__":
    main()
