"""False alarms of trust over time on the value fleets (issue 46 item 1): bench/robustness.py's
``value_alarms`` section.

The development fleets of bench/value.py (stations, homes, pedestrians; its clients, windows and
FedAvg rounds at the product's recipe), every client honest, trained with trust (``trust_rate``
0.2, as bench/over_time.py measures it) and without. A false alarm is an honest client-round
whose weight trust cut (``cut``) or left out (``out``, ``low_trust``); ``test_change`` is the
fleet-mean test MASE of the federated model with trust against without (a fraction; the model of
the round with the best validation score, as bench/value.py tests it), ``val_change_last_round``
the same for the validation MASE after the last round: what trust costs a fleet with no attacker.
"""

from __future__ import annotations

import time

from common import commit, run_parallel

SETTINGS = {"trust": 0.2, "trust_off": None}  # trust_rate as bench/over_time.py measures it, and none


def alarms_job(dataset: str, days: int, setting: str, seed: int, threads: int) -> dict:
    """One value fleet (bench/value.py's quick settings) trained with FedAvg, with or without
    trust: its honest client-rounds cut and left out by trust, the federated model's per-client
    test MASE."""
    import torch
    from value import QUICK, clients, federation, model_config

    from coordinator.simulation.federation import run_federation
    from coordinator.strategy_settings import RobustSettings
    from coordinator.strategies.trust import multiplier
    from edge_agent.selection import window_metrics
    from edge_agent.train import forecasts

    torch.set_num_threads(threads)
    started = time.perf_counter()
    fleet = clients(dataset, days, tuple(sorted((k, v) for k, v in QUICK.items() if not isinstance(v, list))))
    robust = RobustSettings(trust_rate=SETTINGS[setting])
    fed = federation(QUICK, seed).model_copy(update={"robust": robust})
    result = run_federation(fleet, model_config("dlinear", dataset), fed)
    shares = [multiplier(r.trust.get(c.name, robust.trust_prior), robust.trust_full, robust.trust_zero)
              for r in result.records for c in fleet] if robust.trust_rate is not None else []
    test = {c.name: float(window_metrics(forecasts(m, c.test), c.test.scale)["mase"].mean())
            for c, m in zip(fleet, result.models)}
    first_cut = next((r.round for r in result.records for c in fleet if robust.trust_rate is not None
                      and multiplier(r.trust.get(c.name, robust.trust_prior), robust.trust_full, robust.trust_zero) < 1),
                     None)
    return {"dataset": dataset, "history_days": days, "setting": setting, "seed": seed, "test_mase": test,
            "val_mase": [mean(v.mase for v in r.client_val.values()) for r in result.records],
            "tested_round": result.best_round, "first_cut_round": first_cut,
            "client_rounds": len(fleet) * len(result.records), "cut": sum(s < 1 for s in shares),
            "out": sum(s == 0 for s in shares), "seconds": time.perf_counter() - started}


def alarm_rows(runs: list[dict]) -> list[dict]:
    """One row per (dataset, history): false alarms with trust, the test MASE change against none."""
    rows = []
    for dataset, days in sorted({(r["dataset"], r["history_days"]) for r in runs}):
        cell = [r for r in runs if (r["dataset"], r["history_days"]) == (dataset, days)]
        on = {r["seed"]: r for r in cell if r["setting"] == "trust"}
        off = {r["seed"]: r for r in cell if r["setting"] == "trust_off"}
        seeds = sorted(on.keys() & off.keys())
        changes = [mean(on[s]["test_mase"].values()) / mean(off[s]["test_mase"].values()) - 1 for s in seeds]
        worse = [name for s in seeds for name, mase in on[s]["test_mase"].items() if mase > off[s]["test_mase"][name]]
        rounds = sum(on[s]["client_rounds"] for s in seeds)
        last = [on[s]["val_mase"][-1] / off[s]["val_mase"][-1] - 1 for s in seeds]
        rows.append({"dataset": dataset, "history_days": days, "seeds": seeds,
                     "false_alarms": sum(on[s]["cut"] for s in seeds) / max(1, rounds),
                     "left_out": sum(on[s]["out"] for s in seeds) / max(1, rounds),
                     "test_change": mean(changes), "test_change_by_seed": changes,
                     "client_runs_worse": len(worse), "client_runs": sum(len(on[s]["test_mase"]) for s in seeds),
                     "val_change_last_round": mean(last), "tested_rounds": [on[s]["tested_round"] for s in seeds],
                     "first_cut_rounds": [on[s]["first_cut_round"] for s in seeds],
                     "commit": commit()})
    return rows


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def run_value_alarms(cfg: dict, workers: int) -> list[dict]:
    jobs = [(dataset, days, setting, seed) for dataset in cfg["alarm_datasets"] for days in cfg["alarm_days"]
            for seed in cfg["alarm_seeds"] for setting in SETTINGS]
    return alarm_rows(run_parallel(alarms_job, jobs, workers, described))


def described(run: dict) -> str:
    """One finished job's progress line."""
    return (f"{run['dataset']:>11} {run['history_days']:>3} d {run['setting']:>9} seed {run['seed']}: "
            f"cut {run['cut']}/{run['client_rounds']}, out {run['out']} ({run['seconds']:.0f} s)")


COLUMNS = ("dataset", "history", "false alarms", "left out", "first cut in round", "tested round", "test change",
           "val change, last round", "client runs worse", "seeds", "commit")
CAPTION = ("False alarms on the value fleets (issue 46): every client honest, FedAvg at the product's recipe with "
           "trust 0.2; false alarms = client-rounds whose weight trust cut, left out = those it left out; test change "
           "= fleet-mean test MASE with trust vs without, of the round with the best validation score (as value.py "
           "tests it); val change = the validation MASE after the last round (means over seeds).")


def alarm_lines(rows: list[dict]) -> list[str]:
    """The section's table."""
    lines = ["", CAPTION, "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        days = "full" if r["history_days"] == 0 else f"{r['history_days']} d"
        lines.append(f"| {r['dataset']} | {days} | {r['false_alarms']:.1%} | {r['left_out']:.1%} | "
                     f"{r['first_cut_rounds']} | {r['tested_rounds']} | {r['test_change']:+.2%} | {r['val_change_last_round']:+.2%} | "
                     f"{r['client_runs_worse']}/{r['client_runs']} | {len(r['seeds'])} | "
                     f"{r['commit'][:7]} |")
    return lines
