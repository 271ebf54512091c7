"""Does joining the fleet pay? Every method beside the forecasts a gateway makes alone, for free.

Three real multi-site datasets: the bundled weather stations (feature-level non-IID clients carved
from the seven pvlib sites as in bench/fedqaper.py: 10 in quick mode, 20 in full mode), 16 homes
of CityLearn 2022 (load and PV per home) and 21 pedestrian counters of central Auckland (2023;
bench/datasets.py says where each comes from). Each client keeps only the last K days of training
history (K in 14, 30, 90 and the full training split); validation and test stay fixed, every
training window is used. Methods: the anchors (seasonal naive a day and a week back, the
seasonal window average, statsforecast's ETS and Theta, MSTL in full mode), Local-only (early
stopping), FedAvg and FedRep-style FedPer (``personal_epochs``, full mode), Centralized (one
model trained on every gateway's windows pooled: what no federation of the same data can beat,
not a candidate a gateway serves), the
median of FedAvg, Local-only and the anchors (``edge_agent.models.combination``), and
``served``: what the product serves, each gateway re-choosing once a day, among the federated
model, its local-only model, the anchors and the median, the one with the lowest MASE over its
latest two weeks of known outcomes (``edge_agent.selection``; validation windows first, then the
test windows already past, so no forecast is chosen with its own outcome).

Every score is on one scale per feature, fixed whatever K (the whole training split's), so rows
compare across K; MASE (scaled by the training split's in-sample seasonal naive error, as in M4
and M5) is the headline. Reported per (dataset, K, backbone, method): means over seeds, the
seeds' half-range, client runs better than their own Local-only model and than their own best
anchor, and the largest excess of one gateway over its own best anchor. Usage:

    python bench/value.py --quick     # DLinear recipe, 3 datasets x 4 histories x 3 seeds (17-46 min, 2 cores)
    python bench/value.py             # + a spiking backbone, MSTL, FedRep, 20 station clients
    python bench/value.py --quick --report-only   # value.md and value.png again from value.json
    python bench/value.py --quick --newcomers 14,30   # + K-day gateways joining a fleet that holds the whole split
    python bench/value.py --quick --windows /tmp/w.npz   # also keep every run's per-window errors there
    python bench/value.py --quick --report-only --windows /tmp/w.npz   # re-choose "served" without retraining
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from common import bench_parser, commit, configure, panel_row, run_config, run_parallel, save_figure, write_report
from datasets import bench_fleet

from edge_agent.recipe import TRAINING

QUICK = {
    "datasets": ["stations", "homes", "pedestrians"], "history_days": [14, 30, 90, 0], "backbones": ["dlinear"],
    "seeds": [1, 2, 3], "clients": 10, "f_max": 20, "rounds": 10, "local_epochs": 1, "personal_epochs": 1,
    "max_windows": None, "val_stride": 1,
    "anchors": ["seasonal_naive", "seasonal_naive_week", "window_average", "ets", "theta"],
    "learned": ["local", "fedavg", "centralized"], "newcomers": [],
}
FULL = {**QUICK, "backbones": ["dlinear", "spikernn"], "clients": 20, "rounds": 20, "newcomers": [14, 30],
        "anchors": QUICK["anchors"] + ["mstl"], "learned": QUICK["learned"] + ["fedrep"]}
FEDERATED = ("fedavg", "fedrep")  # fedrep: personal_epochs from the config fit the personal part first
POOLED = "centralized"  # every gateway's data in one place: the most a federation of them could learn
SERVED, SERVED_FEDERATED = "served", "fedavg"  # what the product serves, and its federated candidate
NEWCOMER = "fedavg_newcomer"  # FedAvg for a K-day gateway in a fleet whose other half holds the whole split
SERVED_BY = {SERVED_FEDERATED: SERVED, NEWCOMER: "served_newcomer"}  # federated candidate -> what is served with it
SELECTION_DAYS = TRAINING["selection_days"]  # the recipe's: a gateway re-chooses on its last two weeks


def model_config(backbone: str):
    """The product's recipe (ModelConfig's defaults) with ``backbone``."""
    from edge_agent.models import ModelConfig

    return ModelConfig(backbone=backbone)


def clients(dataset: str, days: int, cfg_items: tuple) -> list:
    """The dataset's clients with K days of training history (0: all), windowed for the recipe."""
    recipe = model_config("dlinear")
    cfg = dict(cfg_items)
    return bench_fleet(dataset, days, recipe.lookback, recipe.horizon, 1, cfg["val_stride"], cfg["clients"], cfg["f_max"])


MEDIAN_MEMBERS = ("fedavg", "local")  # with the anchors: the median a gateway may serve
ANCHOR_CACHE = "EDGEFL_VALUE_ANCHOR_CACHE"


def scores(metrics) -> dict:
    return {"mase": metrics.mase, "mse": metrics.mse, "mae": metrics.mae}


def run_job(dataset: str, days: int, backbone: str | None, method: str | None, seed: int | None, cfg: dict,
            threads: int) -> dict:
    """One anchor (``backbone`` None; deterministic, run once), or every learned method and their
    median with one seed, on one (dataset, history): per-client test scores, validation score and
    per-window errors (``windows``, for the daily re-choice of ``served_runs``; not written out)."""
    import torch

    torch.set_num_threads(threads)
    started = time.perf_counter()
    fleet = clients(dataset, days, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    if backbone is None:
        per_method = {method: anchored(fleet, method)}
        cached_anchors(fleet, dataset, days, [method], save=True)
    elif method == NEWCOMER:
        per_method = {NEWCOMER: newcomers(fleet, dataset, backbone, seed, cfg)}
    else:
        cached_anchors(fleet, dataset, days, cfg["anchors"], save=False)
        per_method, models = {}, {}
        for name in cfg["learned"]:
            per_method[name], models[name] = trained(fleet, model_config(backbone), name, seed, cfg)
        if all(name in models for name in MEDIAN_MEMBERS):
            per_method["median"] = median_of(fleet, [models[name] for name in MEDIAN_MEMBERS], cfg["anchors"])
    seconds = time.perf_counter() - started
    return {"runs": [{"dataset": dataset, "history_days": days, "backbone": backbone, "method": name, "seed": seed,
                      "clients": per_client, "seconds": seconds} for name, per_client in per_method.items()]}


def scored(client, val_batches, test_batches) -> dict:
    """One client's test scores, validation score and per-window errors of one candidate."""
    from edge_agent.selection import window_metrics

    val, test = window_metrics(val_batches, client.val.scale), window_metrics(test_batches, client.test.scale)
    return {**{name: float(values.mean()) for name, values in test.items()}, "val": float(val["mase"].mean()),
            "windows": {"val": val["mase"], "test": test, "val_origins": client.val.origins(),
                        "test_origins": client.test.origins(), "horizon": client.test.horizon,
                        "period": client.period}}


def anchored(fleet: list, anchor: str) -> dict:
    """Per-client scores of one anchor (clients too short for it left out)."""
    from edge_agent.selection import anchor_batches

    out = {}
    for client in fleet:
        val, test = anchor_batches(client, anchor, "val"), anchor_batches(client, anchor, "test")
        if val is not None and test is not None:
            out[client.name] = scored(client, val, test)
    return out


def trained(fleet: list, model, method: str, seed: int, cfg: dict) -> tuple[dict, list]:
    """Per-client scores of one learned method with ``model`` (a ModelConfig), and its per-client models."""
    from coordinator.simulation.baselines import TrainingBudget, run_centralized, run_local_only
    from coordinator.simulation.federation import FederationConfig, run_federation
    from edge_agent.config import AgentTraining
    from edge_agent.train import forecasts

    personal = cfg["personal_epochs"] if method == "fedrep" else 0
    recipe = AgentTraining()  # the product's batch size, learning rate and steps per round
    fed = FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=recipe.batch_size,
                           lr=recipe.lr, min_steps=cfg.get("min_steps", recipe.min_steps), seed=seed,
                           test_every_round=False, personal_epochs=personal)
    if method in ("local", "centralized"):
        result = (run_local_only if method == "local" else run_centralized)(fleet, model, TrainingBudget.matching(fed))
    else:
        result = run_federation(fleet, model, fed)
    per_client = {c.name: scored(c, forecasts(m, c.val), forecasts(m, c.test)) for c, m in zip(fleet, result.models)}
    return per_client, result.models


def newcomers(fleet: list, dataset: str, backbone: str, seed: int, cfg: dict) -> dict:
    """FedAvg for the gateways that just joined: every second client (odd positions) keeps only its
    K days, the others hold the whole training split, as in a fleet that has run for a year; scored
    on the newcomers only, beside their own K-day Local-only model and anchors (same windows)."""
    established = clients(dataset, 0, tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    mixed = [old if index % 2 == 0 else new for index, (old, new) in enumerate(zip(established, fleet))]
    scores = learned(mixed, model_config(backbone), "fedavg", seed, cfg)
    return {client.name: scores[client.name] for client in fleet[1::2]}


def learned(fleet: list, model, method: str, seed: int, cfg: dict) -> dict:
    """Per-client scores of one learned method with ``model`` (a ModelConfig)."""
    return trained(fleet, model, method, seed, cfg)[0]


def median_of(fleet: list, models: list[list], anchors: list[str]) -> dict:
    """Per-client scores of the median a gateway may serve: of its ``models`` (one list per method,
    a model per client) and every anchor its history allows (``edge_agent.selection``)."""
    from edge_agent.selection import candidate_batches, median_batches

    out = {}
    for index, client in enumerate(fleet):
        members = {**{f"model{k}": per_client[index] for k, per_client in enumerate(models)}, **dict.fromkeys(anchors)}
        val, test = (median_batches([candidate_batches(client, name, model, split) for name, model in members.items()])
                     for split in ("val", "test"))
        out[client.name] = scored(client, val, test)
    return out


def cached_anchors(fleet: list, dataset: str, days: int, anchors: list[str], save: bool) -> None:
    """Share anchor forecasts between the jobs of one run (ETS and Theta take up to a minute per
    cell): load those another job saved into each client's memo, or with ``save`` save this job's.
    The folder is the run's own (``ANCHOR_CACHE`` in the environment, set by ``main``)."""
    import numpy as np

    folder = os.environ.get(ANCHOR_CACHE)
    if not folder:
        return
    for client in fleet:
        for name in anchors:
            for split in ("val", "test"):
                path = Path(folder) / f"{dataset}-{days}-{client.name}-{name}-{split}.npy"
                if save and (name, split) in client.memo and client.memo[name, split] is not None:
                    np.save(path.with_suffix(".tmp.npy"), client.memo[name, split])
                    os.replace(path.with_suffix(".tmp.npy"), path)
                elif not save and path.exists():
                    client.memo[name, split] = np.load(path)


def jobs(cfg: dict) -> list[tuple]:
    """Every job: the anchors first (the learned jobs' medians reuse their forecasts), then the
    learned ones, each the longest first (the full history, then 90, 30 and 14 days) so the
    workers finish together."""
    cells = [(d, k) for k in sorted(cfg["history_days"], key=lambda k: -(k or 10**6)) for d in cfg["datasets"]]
    return ([(d, k, None, a, None, cfg) for d, k in cells for a in cfg["anchors"]]
            + [(d, k, b, None, s, cfg) for d, k in cells for b in cfg["backbones"] for s in cfg["seeds"]]
            + [(d, k, b, NEWCOMER, s, cfg) for d, k in cells if k in cfg.get("newcomers", ())
               for b in cfg["backbones"] for s in cfg["seeds"]])


def served_runs(runs: list[dict], cfg: dict) -> list[dict]:
    """What each gateway serves per (dataset, K, backbone, seed), re-chosen once a day as its
    forecasts' outcomes come in: each day the candidate (FedAvg as its federated model, its
    local-only model, the anchors, the median where run) with the lowest MASE over the latest
    ``SELECTION_DAYS`` days of windows whose outcome is known by then (validation windows, then
    the test windows already past), the rule of ``edge_agent.selection.select`` applied every
    day; its test scores are those of the forecasts it served. A newcomer's (``served_newcomer``)
    has its newcomer FedAvg model as the federated candidate and no median (the median's
    members are the K-day fleet's models, not the newcomer's)."""
    anchors = [r for r in runs if r["backbone"] is None]
    out = []
    for r in runs:
        if r["method"] not in SERVED_BY:
            continue
        key = (r["dataset"], r["history_days"], r["backbone"], r["seed"])
        same = {x["method"]: x for x in runs if (x["dataset"], x["history_days"], x["backbone"], x["seed"]) == key}
        cell = [a for a in anchors if (a["dataset"], a["history_days"]) == (r["dataset"], r["history_days"])]
        candidates = {"federated": r, "local": same["local"], **{a["method"]: a for a in cell}}
        if "median" in same and r["method"] == SERVED_FEDERATED:
            candidates["median"] = same["median"]
        per_client = {client: served_client({name: run["clients"][client] for name, run in candidates.items()
                                             if client in run["clients"]})
                      for client in r["clients"]}
        out.append({**r, "method": SERVED_BY[r["method"]], "clients": per_client})
    return out


def served_client(candidates: dict[str, dict]) -> dict:
    """One gateway's served test scores and the share of its forecasts each candidate made."""
    import numpy as np

    from edge_agent.selection import choose, recent_score

    first = next(iter(candidates.values()))["windows"]
    horizon, period, test_origins = first["horizon"], first["period"], first["test_origins"]
    origins = np.concatenate([first["val_origins"], test_origins])
    history = {name: np.concatenate([c["windows"]["val"], c["windows"]["test"]["mase"]]) for name, c in candidates.items()}
    days = (test_origins - test_origins[0]) // period
    picks = np.empty(len(test_origins), dtype=object)
    for day in np.unique(days):
        at = int(test_origins[0] + day * period)
        scores = {name: recent_score(errors, origins, horizon, at, SELECTION_DAYS * period)
                  for name, errors in history.items()}
        picks[days == day] = choose(scores)
    served = {metric: float(np.mean([candidates[p]["windows"]["test"][metric][j] for j, p in enumerate(picks)]))
              for metric in ("mase", "mse", "mae")}
    names, counts = np.unique(picks.astype(str), return_counts=True)
    return {**served, "served": {str(n): int(c) for n, c in zip(names, counts)}}


def save_windows(runs: list[dict], config: dict, path: Path) -> None:
    """The runs with their per-window errors, and the run's config (its commit), in one ``.npz``:
    each array under its own key, the rest as JSON naming those keys (plain arrays and JSON:
    nothing to unpickle on reading)."""
    import numpy as np

    arrays: dict[str, np.ndarray] = {}

    def plain(value):
        if isinstance(value, np.ndarray):
            key = f"a{len(arrays)}"
            arrays[key] = value
            return {"__array__": key}
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value.item() if isinstance(value, np.generic) else value

    meta = json.dumps({"runs": [plain(run) for run in runs], "config": config})
    np.savez_compressed(path, meta=np.array(meta), **arrays)


def load_windows(path: Path) -> tuple[list[dict], dict]:
    """The runs ``save_windows`` wrote, arrays restored, and the config of the run that wrote them."""
    import numpy as np

    with np.load(path, allow_pickle=False) as saved:
        arrays = {key: saved[key] for key in saved.files}

    def restored(value):
        if isinstance(value, dict):
            return arrays[value["__array__"]] if set(value) == {"__array__"} else {k: restored(v) for k, v in value.items()}
        return value

    meta = json.loads(str(arrays.pop("meta")))
    return [restored(run) for run in meta["runs"]], meta["config"]


def public(runs: list[dict]) -> list[dict]:
    """The runs as value.json keeps them: without the per-window errors."""
    return [{**r, "clients": {c: {k: v for k, v in s.items() if k != "windows"} for c, s in r["clients"].items()}}
            for r in runs]


def summarize(runs: list[dict], cfg: dict) -> list[dict]:
    """One row per (dataset, K, backbone, method): means over seeds and per-client comparisons."""
    import numpy as np

    anchor_names = set(cfg["anchors"])
    best_anchor = {}
    for r in runs:
        if r["method"] in anchor_names:
            for client, s in r["clients"].items():
                key = (r["dataset"], r["history_days"], client)
                best_anchor[key] = min(best_anchor.get(key, np.inf), s["mase"])
    local = {(r["dataset"], r["history_days"], r["backbone"], r["seed"]): r["clients"] for r in runs
             if r["method"] == "local"}
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["history_days"], r["backbone"], r["method"]), []).append(r)
    rows = []
    for (dataset, days, backbone, method), group in groups.items():
        fleet_means = {m: [float(np.mean([c[m] for c in r["clients"].values()])) for r in group]
                       for m in ("mase", "mse", "mae")}
        excess = [s["mase"] / best_anchor[dataset, days, c] - 1 for r in group for c, s in r["clients"].items()]
        row = {"dataset": dataset, "history_days": days, "backbone": backbone, "method": method,
               "mase": float(np.mean(fleet_means["mase"])), "mse": float(np.mean(fleet_means["mse"])),
               "mae": float(np.mean(fleet_means["mae"])),
               "mase_spread": (max(fleet_means["mase"]) - min(fleet_means["mase"])) / 2,
               "seeds": [r["seed"] for r in group if r["seed"] is not None],
               "client_runs": sum(len(r["clients"]) for r in group),
               "clients_better_than_best_anchor": sum(e < 0 for e in excess),
               "worst_client_vs_best_anchor": max(excess)}
        if backbone is not None:
            row["clients_better_than_local"] = sum(
                s["mase"] < local[dataset, days, backbone, r["seed"]][c]["mase"]
                for r in group for c, s in r["clients"].items())
        if method == NEWCOMER:
            row["same_gateways"] = same_gateways(runs, group, anchor_names)
        if method in SERVED_BY.values():
            counts: dict[str, int] = {}
            for r in group:
                for s in r["clients"].values():
                    for name, n in s["served"].items():
                        counts[name] = counts.get(name, 0) + n
            row["served_share"] = {name: n / sum(counts.values()) for name, n in sorted(counts.items())}
        rows.append(row)
    return rows


def same_gateways(runs: list[dict], group: list[dict], anchor_names: set[str]) -> dict:
    """Local-only (same seeds) and every anchor on exactly the gateways of the newcomer runs
    ``group``: means over those gateways (and seeds), and the best anchor among them."""
    import numpy as np

    first = group[0]
    gateways = list(first["clients"])
    cell = [r for r in runs if (r["dataset"], r["history_days"]) == (first["dataset"], first["history_days"])]
    seeds = {r["seed"] for r in group}
    local = [np.mean([r["clients"][c]["mase"] for c in gateways]) for r in cell
             if r["method"] == "local" and r["backbone"] == first["backbone"] and r["seed"] in seeds]
    everyone_short = [np.mean([r["clients"][c]["mase"] for c in gateways]) for r in cell
                      if r["method"] == "fedavg" and r["backbone"] == first["backbone"] and r["seed"] in seeds]
    anchors = {r["method"]: float(np.mean([r["clients"][c]["mase"] for c in gateways])) for r in cell
               if r["method"] in anchor_names and all(c in r["clients"] for c in gateways)}
    best = min(anchors, key=anchors.__getitem__)
    return {"gateways": len(gateways), "local": float(np.mean(local)), "fedavg_everyone_short": float(np.mean(everyone_short)),
            "best_anchor": best, "best_anchor_mase": anchors[best]}


def verdicts(rows: list[dict], cfg: dict) -> dict:
    """The issue's goals, each with the numbers that decide it."""
    import numpy as np

    out: dict = {"served_at_most_best_anchor": [], "federated_pays_when_scarce": [], "learned_beats_anchors_full": [],
                 "federated_pays_a_newcomer": []}
    for dataset in cfg["datasets"]:
        for days in cfg["history_days"]:
            cell = [r for r in rows if (r["dataset"], r["history_days"]) == (dataset, days)]
            anchor = min((r for r in cell if r["backbone"] is None), key=lambda r: r["mase"])
            for backbone in cfg["backbones"]:
                by = {r["method"]: r for r in cell if r["backbone"] == backbone}
                served = by[SERVED]
                out["served_at_most_best_anchor"].append({
                    "dataset": dataset, "history_days": days, "backbone": backbone, "served": served["mase"],
                    "best_anchor": anchor["method"], "best_anchor_mase": anchor["mase"],
                    "met": served["mase"] <= anchor["mase"] and served["worst_client_vs_best_anchor"] <= 0.02,
                    "worst_client_vs_best_anchor": served["worst_client_vs_best_anchor"]})
                fed = min((by[m] for m in FEDERATED if m in by), key=lambda r: r["mase"])
                gain_local, gain_anchor = 1 - fed["mase"] / by["local"]["mase"], 1 - fed["mase"] / anchor["mase"]
                if days in (14, 30):
                    out["federated_pays_when_scarce"].append({
                        "dataset": dataset, "history_days": days, "backbone": backbone, "federated": fed["method"],
                        "vs_local": gain_local, "vs_best_anchor": gain_anchor,
                        "met": gain_local >= 0.05 and gain_anchor >= 0.05, **pooling_bound(by, anchor)})
                if NEWCOMER in by:
                    new, same = by[NEWCOMER], by[NEWCOMER]["same_gateways"]
                    gain_local, gain_anchor = 1 - new["mase"] / same["local"], 1 - new["mase"] / same["best_anchor_mase"]
                    served_new = by[SERVED_BY[NEWCOMER]]
                    out["federated_pays_a_newcomer"].append({
                        "dataset": dataset, "history_days": days, "backbone": backbone, "gateways": same["gateways"],
                        "fedavg_newcomer": new["mase"], "served_newcomer": served_new["mase"],
                        "served_newcomer_worst_vs_best_anchor": served_new["worst_client_vs_best_anchor"],
                        "local": same["local"],
                        "fedavg_everyone_short": same["fedavg_everyone_short"], "best_anchor": same["best_anchor"],
                        "best_anchor_mase": same["best_anchor_mase"], "vs_local": gain_local,
                        "vs_best_anchor": gain_anchor, "met": gain_local >= 0.05 and gain_anchor >= 0.05})
                if days == 0:
                    best = min((by[m] for m in cfg["learned"] if m in by and m != POOLED), key=lambda r: r["mase"])
                    out["learned_beats_anchors_full"].append({
                        "dataset": dataset, "backbone": backbone, "method": best["method"],
                        "vs_best_anchor": 1 - best["mase"] / anchor["mase"], "met": best["mase"] <= 0.9 * anchor["mase"]})
    scarce = out["federated_pays_when_scarce"]
    out["summary"] = {
        "served_at_most_best_anchor_everywhere": all(v["met"] for v in out["served_at_most_best_anchor"]),
        "datasets_where_federated_pays_when_scarce": sorted({v["dataset"] for v in scarce if v["met"]}),
        "datasets_where_pooling_pays_when_scarce": sorted({v["dataset"] for v in scarce if v.get("pooled_met")}),
        "datasets_where_federated_pays_a_newcomer": sorted(
            {v["dataset"] for v in out["federated_pays_a_newcomer"] if v["met"]}),
        "datasets_where_learned_beats_anchors_by_10pct": sorted(
            {v["dataset"] for v in out["learned_beats_anchors_full"] if v["met"]}),
        "cells": int(np.prod([len(cfg["datasets"]), len(cfg["history_days"])])),
    }
    return out


def pooling_bound(by: dict[str, dict], anchor: dict) -> dict:
    """Where Centralized was run: its gains over Local-only and the best anchor, and whether it
    clears the 5% a federated method is asked for (if pooling every gateway's data cannot, no
    federation of them can)."""
    if POOLED not in by:
        return {}
    pooled = by[POOLED]["mase"]
    vs_local, vs_anchor = 1 - pooled / by["local"]["mase"], 1 - pooled / anchor["mase"]
    return {"pooled": pooled, "pooled_vs_local": vs_local, "pooled_vs_best_anchor": vs_anchor,
            "pooled_met": vs_local >= 0.05 and vs_anchor >= 0.05}


def headline(summary: dict) -> list[str]:
    """One line per (dataset, K, backbone): the best anchor, Local-only, the federated methods and
    what the product serves, with the served forecast's gain over the best anchor and its worst gateway."""
    cfg = summary["config"]
    learned = cfg["learned"] + (["median"] if any(r["method"] == "median" for r in summary["rows"]) else [])
    lines = ["| dataset | K days | backbone | best anchor | " + " | ".join(learned) + " | served | served vs anchor "
             "| worst gateway vs its anchor | served (share of forecasts) |",
             "|---|---|---|---|" + "---|" * len(learned) + "---|---|---|---|"]
    for dataset in cfg["datasets"]:
        for days in cfg["history_days"]:
            cell = [r for r in summary["rows"] if (r["dataset"], r["history_days"]) == (dataset, days)]
            anchor = min((r for r in cell if r["backbone"] is None), key=lambda r: r["mase"])
            for backbone in cfg["backbones"]:
                by = {r["method"]: r for r in cell if r["backbone"] == backbone}
                served = by[SERVED]
                counts = ", ".join(f"{name} {share:.0%}" for name, share in served["served_share"].items())
                lines.append(f"| {dataset} | {days or 'full'} | {backbone} | {anchor['method']} {anchor['mase']:.3f} | "
                             + " | ".join(f"{by[m]['mase']:.3f}" for m in learned)
                             + f" | **{served['mase']:.3f}** | {served['mase'] / anchor['mase'] - 1:+.1%} | "
                             f"{served['worst_client_vs_best_anchor']:+.1%} | {counts} |")
    return lines


def markdown(summary: dict) -> str:
    lines = ["Per cell: the best anchor (chosen on test, in hindsight), each learned method and what the product "
             "serves (test MASE, means over seeds); 'worst gateway' = the largest excess of one gateway's served "
             "MASE over its own best anchor's.", "", *headline(summary), "",
             "MASE (headline), MSE and MAE on the whole training split's scale per feature, means over seeds ± "
             "half-range of the fleet MASE; 'beat local' / 'beat anchor' = client runs better than their own "
             "Local-only model / their own best anchor (on test); 'worst vs anchor' = the largest excess of one "
             "gateway's MASE over its own best anchor's, over clients and seeds.", "",
             "| dataset | K days | backbone | method | MASE | MSE | MAE | beat local | beat anchor | worst vs anchor |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary["rows"]:
        days = s["history_days"] or "full"
        local = f"{s['clients_better_than_local']}/{s['client_runs']}" if "clients_better_than_local" in s else "-"
        lines.append(f"| {s['dataset']} | {days} | {s['backbone'] or '-'} | {s['method']} | {s['mase']:.4f} ± "
                     f"{s['mase_spread']:.4f} | {s['mse']:.4f} | {s['mae']:.4f} | {local} | "
                     f"{s['clients_better_than_best_anchor']}/{s['client_runs']} | {s['worst_client_vs_best_anchor']:+.1%} |")
    lines += newcomer_table(summary["verdicts"]["federated_pays_a_newcomer"])
    v = summary["verdicts"]["summary"]
    lines += ["", f"served <= best anchor and no gateway > +2% over its own best anchor, in every cell: "
              f"{v['served_at_most_best_anchor_everywhere']}; federated beats Local and the best anchor by >= 5% "
              f"at K = 14 or 30 on: {v['datasets_where_federated_pays_when_scarce'] or 'no dataset'} (Centralized, "
              f"every gateway's data pooled, on: {v.get('datasets_where_pooling_pays_when_scarce') or 'no dataset'}), "
              f"and for a "
              f"newcomer on: {v.get('datasets_where_federated_pays_a_newcomer') or 'no dataset'}; a learned "
              f"model beats the best anchor by >= 10% with the full history on: "
              f"{v['datasets_where_learned_beats_anchors_by_10pct'] or 'no dataset'}."]
    return "\n".join(lines) + "\n"


def newcomer_table(cells: list[dict]) -> list[str]:
    """A gateway with K days joining a fleet whose other half holds the whole training split: its
    FedAvg model and what it serves beside its own Local-only model and best anchor (the same
    gateways and windows)."""
    if not cells:
        return []
    lines = ["", "A newcomer: every second gateway keeps K days, the others the whole training split; scored on "
             "the newcomers (test MASE, means over seeds; 'served' chooses daily among its FedAvg model, its "
             "Local-only model and the anchors; 'worst' = the largest excess of one newcomer's served MASE over "
             "its own best anchor's):", "",
             "| dataset | K days | backbone | newcomers | best anchor | local | fedavg (everyone K days) | "
             "fedavg (newcomer) | vs local | vs anchor | served (newcomer) | worst |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in cells:
        lines.append(f"| {v['dataset']} | {v['history_days']} | {v['backbone']} | {v['gateways']} | "
                     f"{v['best_anchor']} {v['best_anchor_mase']:.3f} | {v['local']:.3f} | "
                     f"{v.get('fedavg_everyone_short', float('nan')):.3f} | **{v['fedavg_newcomer']:.3f}** | "
                     f"{-v['vs_local']:+.1%} | {-v['vs_best_anchor']:+.1%} | {served_newcomer(v)} |")
    return lines


def served_newcomer(cell: dict) -> str:
    """The newcomer table's last two cells: what the newcomers serve and their worst excess ("-"
    in a results file written before newcomers were served, 2406378)."""
    if "served_newcomer" not in cell:
        return "- | -"
    return f"{cell['served_newcomer']:.3f} | {cell['served_newcomer_worst_vs_best_anchor']:+.1%}"


def plot(summary: dict, path: Path) -> None:
    """MASE vs history days per method, one panel per (dataset, backbone); anchors dashed."""
    cfg = summary["config"]
    panels = [(d, b) for d in cfg["datasets"] for b in cfg["backbones"]]
    fig, axes = panel_row(len(panels), 3.8)
    days = cfg["history_days"]
    ticks = [d or max(days) * 3 for d in days]
    for ax, (dataset, backbone) in zip(axes, panels):
        methods = [(m, None) for m in cfg["anchors"]] + [(m, backbone) for m in cfg["learned"] + ["median", SERVED]]
        for method, bb in methods:
            by = {r["history_days"]: r["mase"] for r in summary["rows"]
                  if (r["dataset"], r["backbone"], r["method"]) == (dataset, bb, method)}
            if len(by) == len(days):
                ax.plot(ticks, [by[d] for d in days], marker="o" if bb else ".", linestyle="-" if bb else "--",
                        linewidth=2.2 if method == SERVED else 1.0, label=method)
        ax.set(xscale="log", title=f"{dataset}, {backbone}", xlabel="training history (days)", ylabel="test MASE")
        ax.minorticks_off()
        ax.set_xticks(ticks, [str(d or "full") for d in days])
        ax.legend(fontsize=6)
    save_figure(fig, path)


def describe(result: dict) -> str:
    """One line per finished job: each method's fleet MASE."""
    first = result["runs"][0]
    scores = ", ".join(f"{r['method']} {sum(c['mase'] for c in r['clients'].values()) / len(r['clients']):.4f}"
                       for r in result["runs"])
    return (f"{first['dataset']:>11} K={first['history_days'] or 'full':>4} {first['backbone'] or '-':>8} "
            f"seed {first['seed'] or '-'}: MASE {scores} ({first['seconds']:.0f} s)")


def main() -> None:
    parser = bench_parser(__doc__, "DLinear recipe, 10 rounds (17-46 min on 2 cores)")
    parser.add_argument("--report-only", action="store_true", help="re-render value.md and value.png from "
                        "--out/value.json, or with --windows re-choose what is served from the saved runs")
    parser.add_argument("--windows", type=Path, help="an .npz of every run's per-window errors: written after "
                        "training, read by --report-only")
    parser.add_argument("--newcomers", help="history days of the newcomer cells, e.g. 14,30 (default: none in quick "
                        "mode, 14 and 30 in full mode; each adds a federation per seed)")
    args, cfg, started = configure(parser, QUICK, FULL)
    if args.newcomers:
        cfg["newcomers"] = [int(days) for days in args.newcomers.split(",")]
    if args.report_only and not args.windows:
        summary = json.loads((args.out / "value.json").read_text())
        write_report(args.out, "value", summary, markdown, plot)
        return
    if args.report_only:
        runs, config = load_windows(args.windows)
        runs = [run for run in runs if run["method"] not in SERVED_BY.values()]
        config = {**config, "reselected_at": commit()}
    else:
        with tempfile.TemporaryDirectory() as cache:
            os.environ[ANCHOR_CACHE] = cache
            results = run_parallel(run_job, jobs(cfg), args.workers, describe)
        runs = [run for result in results for run in result["runs"]]
        config = run_config(cfg, args.quick, started)
        if args.windows:
            save_windows(runs, config, args.windows)
    runs += served_runs(runs, cfg)
    rows = summarize(runs, cfg)
    summary = {"rows": rows, "anchors": cfg["anchors"], "federated": list(FEDERATED), "served": SERVED,
               "verdicts": None, "runs": public(runs), "config": {**config, "selection_days": SELECTION_DAYS}}
    summary["verdicts"] = verdicts(rows, cfg)
    write_report(args.out, "value", summary, markdown, plot)


if __name__ == "__main__":
    main()
