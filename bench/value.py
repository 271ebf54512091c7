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
not a candidate a gateway serves; at 14 and 30 days in quick mode, where it bounds a verdict), the
median of FedAvg, Local-only and the anchors (``edge_agent.models.combination``), and
``served``: what the product serves (``edge_agent.selection``, run in the job that trained the
models), each gateway re-choosing once a day, among the federated model, its local-only model,
the anchors and the median, the mean of the two with the lowest MASE over its known outcomes, a
day's weight halving every two weeks (``edge_agent.choice``; validation windows first, then the
test windows already past, so no forecast is chosen with its own outcome).

Every score is on one scale per feature, fixed whatever K (the whole training split's), so rows
compare across K; MASE (scaled by the training split's in-sample seasonal naive error, as in M4
and M5) is the headline. Reported per (dataset, K, backbone, method): means over seeds, the
seeds' half-range, client runs better than their own Local-only model and than their own best
anchor, and the largest excess of one gateway over its own best anchor. Usage:

    python bench/value.py --quick     # DLinear recipe, 3 datasets x 4 histories x 3 seeds (30 min, 2 cores)
    python bench/value.py             # + a spiking backbone, MSTL, FedRep, 20 station clients
    python bench/value.py --quick --report-only   # value.md and value.png again from value.json
    python bench/value.py --quick --windows /tmp/w.npz   # also keep every run's per-window errors there
    python bench/value.py --quick --report-only --windows /tmp/w.npz   # the report again from them

(bench/selection.py replays single-candidate rules from the saved per-window errors:
``served_runs``, the product's rule with ``combine`` = 1.)
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from common import bench_parser, commit, configure, run_config, run_parallel, write_report
from datasets import bench_fleet, dataset_interval
from sealed import SEALED, SEALED_DECLARED, SEALED_FROZEN_AT
from value_report import FEDERATED, POOLED, SERVED, SERVED_FEDERATED, markdown, plot, summarize, verdicts

from edge_agent.recipe import ANCHORS, TRAINING

QUICK = {
    "datasets": ["stations", "homes", "pedestrians"], "history_days": [14, 30, 90, 0], "backbones": ["dlinear"],
    "seeds": [1, 2, 3], "clients": 10, "f_max": 20, "rounds": 10, "local_epochs": 1, "personal_epochs": 1,
    "max_windows": None, "val_stride": 1,
    "origins_every": "1h",  # validation and test windows start at most every hour (every row of hourly data)
    "anchors": list(ANCHORS),  # the recipe's: every anchor a gateway compares itself with
    "learned": ["local", "fedavg", "centralized"],
    "pooled_days": [14, 30],  # Centralized where its bound decides a verdict (the scarce cells)
}
FULL = {**QUICK, "backbones": ["dlinear", "spikernn"], "clients": 20, "rounds": 20,
        "anchors": QUICK["anchors"] + ["mstl"], "learned": QUICK["learned"] + ["fedrep"], "pooled_days": [14, 30, 90, 0]}
SEALED_QUICK_DAYS = [14, 30, 0]
"""The sealed quick mode's histories: 90 days left out to stay within 30 minutes (a training step on
10-minute data, a lookback of 1,008 rows, costs about six of hourly data; a round's steps are capped
alike, so a 90-day cell costs what the full one does; the Stambruges rooms hold 96 days in all)."""
SELECTION_DAYS = TRAINING["selection_days"]  # the recipe's: the half-life of an outcome's weight in the choice
COMBINE = TRAINING["combine"]  # the recipe's: how many of the best candidates a gateway serves the mean of


def model_config(backbone: str, dataset: str):
    """The product's recipe (ModelConfig's defaults) with ``backbone``, its spans in steps of the
    dataset's sampling interval (what ``simulate --data`` does)."""
    from edge_agent.models import ModelConfig

    return ModelConfig(backbone=backbone).at_interval(dataset_interval(dataset))


def clients(dataset: str, days: int, cfg_items: tuple) -> list:
    """The dataset's clients with K days of training history (0: all), windowed for the recipe:
    training windows at every row, validation and test windows every ``origins_every`` (every
    row of hourly data, every sixth of 10-minute data: what makes the sealed quick mode fit its
    30 minutes; the mean over hourly origins estimates the every-row score)."""
    from edge_agent.models.config import steps_of

    recipe = model_config("dlinear", dataset)
    cfg = dict(cfg_items)
    every = steps_of(cfg.get("origins_every", "1h"), recipe.interval)
    return bench_fleet(dataset, days, recipe.lookback, recipe.horizon, 1, max(cfg["val_stride"], every), cfg["clients"],
                       cfg["f_max"], every)


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
    else:
        cached_anchors(fleet, dataset, days, cfg["anchors"], save=False)
        per_method, models = {}, {}
        for name in learned_methods(cfg, days):
            per_method[name], models[name] = trained(fleet, model_config(backbone, dataset), name, seed, cfg)
        if all(name in models for name in MEDIAN_MEMBERS):
            per_method["median"] = median_of(fleet, [models[name] for name in MEDIAN_MEMBERS], cfg["anchors"])
            per_method[SERVED] = served_by_product(fleet, models, cfg)
    seconds = time.perf_counter() - started
    return {"runs": [{"dataset": dataset, "history_days": days, "backbone": backbone, "method": name, "seed": seed,
                      "clients": per_client, "seconds": seconds} for name, per_client in per_method.items()]}


def learned_methods(cfg: dict, days: int) -> list[str]:
    """The learned methods one job trains: Centralized only at the histories of ``pooled_days``
    (every history where the config names none)."""
    return [name for name in cfg["learned"] if name != POOLED or days in cfg.get("pooled_days", [days])]


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


def federation(cfg: dict, seed: int, personal_epochs: int = 0):
    """The bench's rounds with the product's batch size, learning rate and steps per round."""
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.config import AgentTraining

    recipe = AgentTraining()
    return FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=recipe.batch_size,
                            lr=recipe.lr, min_steps=cfg.get("min_steps", recipe.min_steps), max_steps=recipe.max_steps,
                            seed=seed, test_every_round=False, personal_epochs=personal_epochs)


def trained(fleet: list, model, method: str, seed: int, cfg: dict) -> tuple[dict, list]:
    """Per-client scores of one learned method with ``model`` (a ModelConfig), and its per-client models."""
    from coordinator.simulation.baselines import TrainingBudget, run_centralized, run_local_only
    from coordinator.simulation.federation import run_federation
    from edge_agent.train import forecasts

    fed = federation(cfg, seed, cfg["personal_epochs"] if method == "fedrep" else 0)
    if method in ("local", "centralized"):
        result = (run_local_only if method == "local" else run_centralized)(fleet, model, TrainingBudget.matching(fed))
    else:
        result = run_federation(fleet, model, fed)
    per_client = {c.name: scored(c, forecasts(m, c.val), forecasts(m, c.test)) for c, m in zip(fleet, result.models)}
    return per_client, result.models


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


def served_by_product(fleet: list, models: dict[str, list], cfg: dict) -> dict:
    """Per-client scores of what the product serves over the test windows (``edge_agent.selection``:
    ``select`` before the first test day, re-chosen each day by ``served_days``) among FedAvg as
    the federated model, Local-only, the anchors and their median, and each candidate's share of
    the served forecasts (a mean of k gives each of its k a k-th of its windows)."""
    from edge_agent.selection import select, served_days, window_metrics

    out = {}
    for index, client in enumerate(fleet):
        candidates = {"federated": models[SERVED_FEDERATED][index], "local": models["local"][index]}
        served = select(client, candidates, cfg["anchors"], median=True, selection_days=SELECTION_DAYS,
                        combine=cfg.get("combine", COMBINE))
        batches, picks = served_days(client, served)
        test = window_metrics(batches, client.test.scale)
        shares: dict[str, float] = {}
        for pick in picks:
            for name in pick:
                shares[name] = shares.get(name, 0.0) + 1 / len(pick)
        out[client.name] = {**{name: float(values.mean()) for name, values in test.items()}, "served": shares}
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
            + [(d, k, b, None, s, cfg) for d, k in cells for b in cfg["backbones"] for s in cfg["seeds"]])


def served_runs(runs: list[dict], cfg: dict) -> list[dict]:
    """What each gateway would serve per (dataset, K, backbone, seed) with one candidate at a time
    (the product's rule at ``combine`` = 1, replayed from saved per-window errors: what
    bench/selection.py compares), re-chosen once a day as its forecasts'
    outcomes come in: each day the candidate (FedAvg as its federated model, its
    local-only model, the anchors, the median where run) with the lowest MASE over the latest
    ``SELECTION_DAYS`` days of windows whose outcome is known by then (validation windows, then
    the test windows already past), the rule of ``edge_agent.selection.select`` applied every
    day; its test scores are those of the forecasts it served. (A gateway joining a fleet with
    history: bench/time_to_value.py.)"""
    anchors = [r for r in runs if r["backbone"] is None]
    out = []
    for r in runs:
        if r["method"] != SERVED_FEDERATED:
            continue
        key = (r["dataset"], r["history_days"], r["backbone"], r["seed"])
        same = {x["method"]: x for x in runs if (x["dataset"], x["history_days"], x["backbone"], x["seed"]) == key}
        cell = [a for a in anchors if (a["dataset"], a["history_days"]) == (r["dataset"], r["history_days"])]
        candidates = {"federated": r, "local": same["local"], **{a["method"]: a for a in cell}}
        if "median" in same:
            candidates["median"] = same["median"]
        per_client = {client: served_client({name: run["clients"][client] for name, run in candidates.items()
                                             if client in run["clients"]})
                      for client in r["clients"]}
        out.append({**r, "method": SERVED, "clients": per_client})
    return out


def served_client(candidates: dict[str, dict]) -> dict:
    """One gateway's served test scores and the share of its forecasts each candidate made."""
    import numpy as np

    from edge_agent.choice import daily_picks

    first = next(iter(candidates.values()))["windows"]
    horizon, period, test_origins = first["horizon"], first["period"], first["test_origins"]
    origins = np.concatenate([first["val_origins"], test_origins])
    history = {name: np.concatenate([c["windows"]["val"], c["windows"]["test"]["mase"]]) for name, c in candidates.items()}
    picks = np.array([pick[0] for pick in daily_picks(history, origins, horizon, period, test_origins,
                                                       SELECTION_DAYS * period)], dtype=object)
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


def describe(result: dict) -> str:
    """One line per finished job: each method's fleet MASE."""
    first = result["runs"][0]
    scores = ", ".join(f"{r['method']} {sum(c['mase'] for c in r['clients'].values()) / len(r['clients']):.4f}"
                       for r in result["runs"])
    return (f"{first['dataset']:>11} K={first['history_days'] or 'full':>4} {first['backbone'] or '-':>8} "
            f"seed {first['seed'] or '-'}: MASE {scores} ({first['seconds']:.0f} s)")


def main() -> None:
    parser = bench_parser(__doc__, "DLinear recipe, 10 rounds (30 min on 2 cores)")
    parser.add_argument("--report-only", action="store_true", help="re-render value.md and value.png from "
                        "--out/value.json, or with --windows re-choose what is served from the saved runs")
    parser.add_argument("--windows", type=Path, help="an .npz of every run's per-window errors: written after "
                        "training, read by --report-only")
    parser.add_argument("--sealed", action="store_true", help="the sealed datasets (bench/sealed.py), frozen "
                        "before any of their numbers was looked at and used for no choice: value_sealed.json")
    args, cfg, started = configure(parser, QUICK, FULL)
    if args.sealed:
        cfg["datasets"] = list(SEALED)
        cfg["history_days"] = SEALED_QUICK_DAYS if args.quick else cfg["history_days"]
    name, split = ("value_sealed", "sealed") if args.sealed else ("value", "dev")
    if args.report_only and not args.windows:
        summary = json.loads((args.out / f"{name}.json").read_text())
        write_report(args.out, name, summary, markdown, plot)
        return
    if args.report_only:
        runs, config = load_windows(args.windows)
    else:
        with tempfile.TemporaryDirectory() as cache:
            os.environ[ANCHOR_CACHE] = cache
            results = run_parallel(run_job, jobs(cfg), args.workers, describe)
        runs = [run for result in results for run in result["runs"]]
        config = run_config(cfg, args.quick, started)
        if args.windows:
            save_windows(runs, config, args.windows)
    rows = [{**row, "split": split} for row in summarize(runs, cfg)]
    summary = {"rows": rows, "anchors": cfg["anchors"], "federated": list(FEDERATED), "served": SERVED,
               "verdicts": None, "runs": public(runs), "config": {**config, "selection_days": SELECTION_DAYS, "combine": COMBINE},
               "sealed_frozen_at": SEALED_FROZEN_AT, **({"declared": list(SEALED_DECLARED)} if args.sealed else {})}
    summary["verdicts"] = verdicts(rows, cfg)
    write_report(args.out, name, {**summary, **time_to_value_sections(args.out / f"{name}.json")}, markdown, plot)


TIME_TO_VALUE_SECTIONS = ("time_to_value", "time_to_value_config")  # written by bench/time_to_value.py


def time_to_value_sections(path: Path) -> dict:
    """The sections bench/time_to_value.py wrote into an existing results file (its rows, with
    their own commit and config): a re-run of this bench keeps them rather than dropping them."""
    if not path.is_file():
        return {}
    existing = json.loads(path.read_text())
    return {key: existing[key] for key in TIME_TO_VALUE_SECTIONS if key in existing}


if __name__ == "__main__":
    main()
