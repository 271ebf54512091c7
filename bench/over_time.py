"""Influence over time (issue 46): bench/robustness.py's ``over_time`` section.

The oracle below-screen flipper with an inflated count (``below_screen_hello``: its delta reversed
at 3x its own norm, 10**12 samples claimed at hello and in every update) as 1 of 4 and 1 of 7 of
the robustness bench's station clients, over 50 rounds, FedAvg with the default bounds, with
trust on (the default) and off. ``change_by_round`` is the honest clients' mean validation MASE
at rounds 10, 20 and 50 against the clean run of the same settings (a fraction, mean over
seeds); ``false_alarms`` is the share of honest client-rounds whose weight trust cut, on the
clean fleets (no attacker) and on the attacked fleets' honest clients. ``absent_by_round`` is the
same change with the attacker's gateway silent from the start (dropped, trust on): what leaving
it out costs the honest clients at best, since its honest data helped them in the clean run.
"""

from __future__ import annotations

import time

from common import commit, run_parallel

ATTACK = "below_screen_hello"
SETTINGS = {"trust": {"trust_rate": 0.2}, "trust_off": {"trust_rate": None}}  # trust as measured, and none
CHECKPOINTS = (10, 20, 50)
VARIANTS = ("clean", "attacked", "absent")


def over_time_job(setting: str, variant: str, clients: int, seed: int, cfg: dict, threads: int) -> dict:
    """One federation of ``clients`` with the first one flipping (``attacked``), silent (``absent``)
    or honest (``clean``): the other clients' mean validation MASE after every round, and their
    client-rounds whose weight trust cut."""
    import numpy as np
    import torch
    from robustness import fleet

    from coordinator.simulation.attacks import claims_for, tamper_for
    from coordinator.simulation.federation import FederationConfig, run_federation
    from coordinator.simulation.participation import Participation
    from coordinator.strategy_settings import RobustSettings
    from coordinator.strategies.trust import multiplier
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    data = fleet(tuple(sorted((k, v) for k, v in {**cfg, "clients": clients}.items() if not isinstance(v, list))))
    attacked, present = variant == "attacked", np.ones((cfg["over_time_rounds"], clients), dtype=np.int8)
    present[:, 0] = variant != "absent"
    bad = {data[0].name} if variant != "clean" else set()
    robust = RobustSettings(**SETTINGS[setting])
    model = ModelConfig.paper(backbone="dlinear", lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
                              qap_heads=cfg["qap_heads"], hidden=cfg["hidden"], d_ff=cfg["d_ff"], heads=cfg["heads"])
    fed = FederationConfig(rounds=cfg["over_time_rounds"], local_epochs=cfg["local_epochs"],
                           batch_size=cfg["batch_size"], lr=cfg["lr"], seed=seed, test_every_round=False,
                           tested_round="last", strategy="fedavg", robust=robust)
    result = run_federation(data, model, fed, participation=Participation(variant, present, np.zeros_like(present)),
                            tamper=tamper_for(ATTACK, bad) if attacked else None,
                            claims=claims_for(ATTACK, bad) if attacked else None)
    honest = [c.name for c in data if c.name not in bad]
    cut = sum(multiplier(r.trust.get(c, robust.trust_prior), robust.trust_full, robust.trust_zero) < 1
              for r in result.records for c in honest) if robust.trust_rate is not None else 0
    return {"setting": setting, "variant": variant, "clients": clients, "seed": seed,
            "honest_mase": [sum(r.client_val[c].mase for c in honest) / len(honest) for r in result.records],
            "honest_cut": cut, "honest_client_rounds": len(honest) * len(result.records),
            "attacker_out": [r.round for r in result.records if any(c in r.rejected for c in bad)],
            "seconds": time.perf_counter() - started}


def over_time_rows(runs: list[dict]) -> list[dict]:
    """One row per (clients, setting): change_by_round against the clean run, false alarms."""
    rows = []
    for clients in sorted({r["clients"] for r in runs}):
        for setting in SETTINGS:
            group = [r for r in runs if (r["clients"], r["setting"]) == (clients, setting)]
            attacked = [r for r in group if r["variant"] == "attacked"]
            clean = {r["seed"]: r for r in group if r["variant"] == "clean"}
            absent = [r for r in runs if (r["clients"], r["variant"]) == (clients, "absent")]
            rows.append({"attack": ATTACK, "attackers": 1, "of_clients": clients, "setting": setting,
                         "change_by_round": {str(k): change(attacked, clean, k) for k in CHECKPOINTS},
                         "absent_by_round": {str(k): change(absent, clean, k) for k in CHECKPOINTS},
                         "change_by_seed": {str(k): [ratio(r, clean[r["seed"]], k) for r in attacked]
                                            for k in CHECKPOINTS},
                         "false_alarms_clean": share(clean.values()), "false_alarms_attacked": share(attacked),
                         "attacker_first_out": [min(r["attacker_out"], default=None) for r in attacked],
                         "seeds": sorted(clean), "commit": commit()})
    return rows


def ratio(run: dict, clean: dict, round_number: int) -> float:
    return run["honest_mase"][round_number - 1] / clean["honest_mase"][round_number - 1] - 1


def change(attacked: list[dict], clean: dict[int, dict], round_number: int) -> float:
    """Honest validation MASE at ``round_number`` vs the clean run, means over seeds, as a fraction."""
    mean = sum(r["honest_mase"][round_number - 1] for r in attacked) / len(attacked)
    base = sum(clean[r["seed"]]["honest_mase"][round_number - 1] for r in attacked) / len(attacked)
    return mean / base - 1


def share(runs) -> float:
    """Honest client-rounds whose weight trust cut, as a share of all honest client-rounds."""
    runs = list(runs)
    return sum(r["honest_cut"] for r in runs) / max(1, sum(r["honest_client_rounds"] for r in runs))


def run_over_time(cfg: dict, workers: int) -> list[dict]:
    jobs = [(setting, variant, n, seed, cfg) for n in sorted(cfg["over_time_clients"], reverse=True)
            for seed in cfg["over_time_seeds"] for setting in SETTINGS for variant in VARIANTS
            if variant != "absent" or setting == "trust"]
    runs = run_parallel(over_time_job, jobs, workers,
                        lambda r: f"{r['setting']:>9} {r['variant']:>8} of {r['clients']} "
                                  f"seed {r['seed']}: honest MASE {r['honest_mase'][-1]:.4f}, "
                                  f"cut {r['honest_cut']} ({r['seconds']:.0f} s)")
    return over_time_rows(runs)


def markdown_lines(rows: list[dict]) -> list[str]:
    """The section's table: change by round per (fleet, setting) and the false alarms."""
    lines = ["", "Over time (issue 46): the below-screen flipper with an inflated count, 1 of N, FedAvg with the "
             "default bounds; honest validation MASE vs the clean run at rounds 10, 20 and 50 (mean over seeds); "
             "false alarms = honest client-rounds whose weight trust cut (clean fleet; attacked fleet); 'absent' = "
             "the same change with the attacker's gateway silent from the start (what leaving it out costs).", "",
             "| attackers | setting | round 10 | round 20 | round 50 | absent 10 / 20 / 50 | false alarms clean | "
             "attacked | attacker out from | seeds | commit |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        steps = " | ".join(f"{r['change_by_round'][str(k)]:+.1%}" for k in CHECKPOINTS)
        floor = " / ".join(f"{r['absent_by_round'][str(k)]:+.1%}" for k in CHECKPOINTS)
        lines.append(f"| 1 of {r['of_clients']} | {r['setting']} | {steps} | {floor} | {r['false_alarms_clean']:.1%} | "
                     f"{r['false_alarms_attacked']:.1%} | {r['attacker_first_out']} | {len(r['seeds'])} | "
                     f"{r['commit'][:7]} |")
    return lines
