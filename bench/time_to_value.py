"""Time to value: what a gateway serves in its first 30 days in a fleet, beside what it serves alone.

A fleet has run on every second site of a dataset for a year's training split (FedAvg, the
product's recipe and round settings, as in bench/value.py). Each other site joins at the first row
after that split, with nothing before it. On day k after joining (k = 1..30) it holds k days of its
own rows and serves the forecasts of that day (one origin per row, a day ahead), choosing once at
the start of the day with the product's rule (``edge_agent.choice``: lowest mean MASE over its
own windows whose outcome is known, a day's weight halving every two weeks; a candidate is scored over the windows
it has forecasts for). Alone, its candidates are the anchors (each refitted every day on every row
it has; one that needs more rows waits), its local-only model (trained on its own rows, weekly,
once it holds the rows local training needs) and, as the product serves it, the median of them
(``edge_agent.newcomer.with_median``); joined, also the fleet's model (in the median too), which
runs on a lookback filled by season where the gateway holds less than one
(``edge_agent.newcomer.seasonal_fill``) and serves on day 1, before any outcome is known, and its
local model starts from the fleet's model instead of at random, as the product's companion of a
gateway that joins a trained fleet does (``LocalCompanion.start_from``). The fleet's model is the
one of the round the gateway joined in, not trained on the newcomer (the newcomer's own updates
would move it little in the next rounds). Scores are MASE on the scale of the site's training
split (fixed, as in bench/value.py). The weather stations join as sites (``weather_sites``: the seven
bundled stations, a gateway each, with the feature sets they measure), not as value.py's feature
draws, so that each joining client is a site the fleet never saw.

    python bench/time_to_value.py --quick            # homes, pedestrians, weather sites, 3 seeds (5-15 min, 2 cores)
    python bench/time_to_value.py --quick --sealed   # the sealed datasets (bench/sealed.py)
"""

from __future__ import annotations

import json
import time

from common import bench_parser, commit, configure, run_config, run_parallel
from datasets import bench_fleet, dataset_tables
from sealed import SEALED, SEALED_DECLARED, SEALED_FROZEN_AT
from time_to_value_report import markdown, plot, summarize
from value import TIME_TO_VALUE_SECTIONS, federation, model_config

from edge_agent.newcomer import FLEET, with_median
from edge_agent.recipe import ANCHORS, TRAINING

QUICK = {"datasets": ["homes", "pedestrians", "weather_sites"], "seeds": [1, 2, 3], "days": 30,
         "report_days": [1, 3, 7, 14, 30], "rounds": 10, "local_epochs": 1, "local_every_days": 7, "anchors": list(ANCHORS),
         "selection_days": TRAINING["selection_days"], "median": TRAINING["median"],
         "combine": TRAINING["combine"]}
FULL = {**QUICK, "seeds": [1, 2, 3, 4, 5]}


def fleet(dataset: str) -> list:
    """Every site of ``dataset`` as a client with its whole training split, windowed for the recipe."""
    recipe = model_config("dlinear", dataset)
    return bench_fleet(dataset, 0, recipe.lookback, recipe.horizon, 1, 1)


def fleet_job(dataset: str, seed: int, cfg: dict, threads: int) -> dict:
    """Train the established fleet (every second site, from the first) and return its last global
    state, with the CPU seconds one gateway's round took."""
    import torch

    from coordinator.simulation.federation import run_federation

    torch.set_num_threads(threads)
    established = fleet(dataset)[0::2]
    cpu, wall = time.process_time(), time.perf_counter()
    result = run_federation(established, model_config("dlinear", dataset), federation(cfg, seed))
    per_round = (time.process_time() - cpu) / (cfg["rounds"] * len(established))
    return {"dataset": dataset, "seed": seed, "state": {k: v.numpy() for k, v in result.shared.items()},
            "cpu_seconds_per_round_per_gateway": per_round, "seconds": time.perf_counter() - wall}


def newcomer_job(dataset: str, position: int, states: dict, cfg: dict, threads: int) -> dict:
    """One joining site's daily MASE, joined and alone, for every seed's fleet."""
    import torch

    from joining import Timeline, days_held

    torch.set_num_threads(threads)
    started = time.perf_counter()
    recipe = model_config("dlinear", dataset)
    table, client = dataset_tables(dataset)[position], fleet(dataset)[position]
    timeline = Timeline(table, client, recipe, days_held(table, client, recipe, cfg["days"]))
    anchors = {name: timeline.anchor_forecasts(name) for name in cfg["anchors"]}
    runs = []
    for seed, state in states.items():
        fed, every = federation(cfg, seed), cfg["local_every_days"]
        alone = {**anchors, "local": timeline.local_forecasts(seed, fed, every)}
        joined = {FLEET: timeline.model_forecasts(timeline.fleet_model(state, seed)), **anchors,
                  "local": timeline.local_forecasts(seed, fed, every, fleet_state=state)}
        sides = {"joined": joined, "alone": alone}
        runs.append({"seed": seed, **{side: timeline.served(with_median(candidates, cfg["median"]), cfg["selection_days"],
                                                                      cfg["combine"])
                                      for side, candidates in sides.items()}})
    return {"dataset": dataset, "client": timeline.name, "days": timeline.days, "runs": runs,
            "seconds": time.perf_counter() - started}


def describe_fleet(result: dict) -> str:
    return (f"{result['dataset']:>21} seed {result['seed']}: fleet trained, "
            f"{result['cpu_seconds_per_round_per_gateway']:.1f} CPU s per round per gateway ({result['seconds']:.0f} s)")


def describe_newcomer(result: dict) -> str:
    return f"{result['dataset']:>21} {result['client']}: {len(result['runs'])} seeds ({result['seconds']:.0f} s)"


def main() -> None:
    parser = bench_parser(__doc__, "homes, pedestrians and weather sites, 3 seeds (about 15 min on 2 cores)")
    parser.add_argument("--sealed", action="store_true", help="the sealed datasets (bench/sealed.py)")
    parser.add_argument("--report-only", action="store_true", help="re-render the report from its json")
    args, cfg, started = configure(parser, QUICK, FULL)
    if args.sealed:
        cfg["datasets"] = list(SEALED)
    name, split = ("time_to_value_sealed", "sealed") if args.sealed else ("time_to_value", "dev")
    if args.report_only:  # the rows again from the stored per-day scores, by this commit's report code
        summary = json.loads((args.out / f"{name}.json").read_text())
        summary["rows"] = summarize(summary["newcomers"], split, summary["config"])
        summary["rows_commit"] = commit()
    else:
        fleets = run_parallel(fleet_job, [(d, s, cfg) for d in cfg["datasets"] for s in cfg["seeds"]], args.workers,
                              describe_fleet)
        states = {d: {f["seed"]: f["state"] for f in fleets if f["dataset"] == d} for d in cfg["datasets"]}
        joins = [(d, p, states[d], cfg) for d in cfg["datasets"] for p in range(1, len(fleet(d)), 2)]
        newcomers = run_parallel(newcomer_job, joins, args.workers, describe_newcomer)
        cpu = {d: [f["cpu_seconds_per_round_per_gateway"] for f in fleets if f["dataset"] == d] for d in cfg["datasets"]}
        summary = {"split": split, "sealed_frozen_at": SEALED_FROZEN_AT, "rows": summarize(newcomers, split, cfg),
                   "newcomers": newcomers, "cpu_seconds_per_round_per_gateway": cpu,
                   "config": run_config(cfg, args.quick, started)}
    if args.sealed:
        summary["declared"] = list(SEALED_DECLARED)
    write(args.out, name, summary)


def write(out, name: str, summary: dict) -> None:
    """The report, and its rows as the top-level ``time_to_value`` section of value.json (or
    value_sealed.json), with the commit and config they were measured at."""
    from common import write_report

    write_report(out, name, summary, markdown, plot)
    value_file = out / ("value_sealed.json" if summary["split"] == "sealed" else "value.json")
    if value_file.exists():
        value = json.loads(value_file.read_text())
        value.update(zip(TIME_TO_VALUE_SECTIONS, (summary["rows"], summary["config"])))
        value_file.write_text(json.dumps(value, indent=2))


if __name__ == "__main__":
    main()
