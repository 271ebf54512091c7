"""Round policies with a straggler (issue 46): simulated wall time to a target validation MASE,
synchronous rounds against buffered ones (FedBuff).

Four of the robustness bench's station clients (feature-level non-IID), FedAvg, DLinear; three
train in 0.8-1.2 simulated seconds (drawn per seed), the fourth takes ``straggler`` times the
slowest of them. The timed simulation (``coordinator.simulation.timing``) closes each round by
the policy's own rule, the same ``RoundPolicy.close_reason`` the service runs:

- ``sync_quorum``: today's default, quorum 0.8 (3 of 4) + grace 0.5; the straggler's updates
  arrive late, and since it is never on time they are not used; after 3 misses it is not waited
  for (asked again after 3, then 6, 12... rounds), as the service excludes it.
- ``sync_all``: quorum 1, every round waits for the straggler.
- ``buffered``: K = 3, each late update folded in with its change scaled by 1/sqrt(1 + t).

The target is, per seed, the worst of the policies' best validation MASE plus 1% (a level each
policy reaches); ``seconds_to_target`` is the simulated time at the close of the first round at
or below it. ``mase_in_budget`` is each policy's best validation MASE among the rounds closed
within the shortest run's simulated time (the same wall-time budget for all). Aggregation and
transfers take no time here. Same seeds, same numbers.
"""

from __future__ import annotations

import json
import statistics
import time

from common import bench_parser, configure, run_config, run_parallel

QUICK = {"clients": 4, "f_max": 20, "lookback": 48, "horizon": 24, "d_qap": 32, "qap_heads": 4, "hidden": 32,
         "d_ff": 64, "heads": 4, "stride": 29, "val_stride": 24, "batch_size": 32, "lr": 3e-3, "rounds": 30,
         "local_epochs": 1, "seeds": [1, 2, 3], "straggler": 4.0, "deadline_s": 30.0, "buffer_size": 3,
         "target_margin": 0.01}
FULL = {**QUICK, "stride": 7, "val_stride": 4, "rounds": 60, "seeds": [1, 2, 3, 4, 5]}
POLICIES = {
    "sync_quorum": {},
    "sync_all": {"quorum": 1.0},
    "buffered": {"policy": "buffered", "buffer": {}},
}


def durations(seed: int, clients: int, straggler: float) -> list[float]:
    """Each client's training time in simulated seconds: the last one is the straggler."""
    import numpy as np

    fast = np.random.default_rng(seed).uniform(0.8, 1.2, clients - 1)
    return [*(round(float(d), 3) for d in fast), round(float(fast.max()) * straggler, 3)]


def run_job(policy: str, seed: int, cfg: dict, threads: int) -> dict:
    """One timed federation: each round's close time and reason, the fleet's and each client's
    validation MASE after it, and who entered stale."""
    import torch
    from robustness import fleet

    from coordinator.simulation.federation import run_federation
    from coordinator.simulation.federation_config import FederationConfig
    from coordinator.simulation.timing import timed
    from coordinator.strategies import RoundPolicy
    from coordinator.strategy_settings import ParticipationSettings
    from edge_agent.models import ModelConfig

    torch.set_num_threads(threads)
    started = time.perf_counter()
    data = fleet(tuple(sorted((k, v) for k, v in cfg.items() if not isinstance(v, list))))
    settings = dict(POLICIES[policy])
    if "buffer" in settings:
        settings["buffer"] = {"size": cfg["buffer_size"]}
    participation = ParticipationSettings(**settings)
    model = ModelConfig.paper(backbone="dlinear", lookback=cfg["lookback"], horizon=cfg["horizon"], d_qap=cfg["d_qap"],
                              qap_heads=cfg["qap_heads"], hidden=cfg["hidden"], d_ff=cfg["d_ff"], heads=cfg["heads"])
    fed = FederationConfig(rounds=cfg["rounds"], local_epochs=cfg["local_epochs"], batch_size=cfg["batch_size"],
                           lr=cfg["lr"], seed=seed, test_every_round=False, tested_round="last", strategy="fedavg",
                           participation=participation)
    times = durations(seed, len(data), cfg["straggler"])
    schedule = timed(RoundPolicy(participation, 1, seed), times, cfg["rounds"], cfg["deadline_s"])
    result = run_federation(data, model, fed, participation=schedule.participation)
    return {"policy": policy, "seed": seed, "durations": times, "closed_at": list(schedule.closed_at),
            "closed_by": list(schedule.closed_by), "mase": [r.val.mase for r in result.records],
            "client_mase": [{c: m.mase for c, m in r.client_val.items()} for r in result.records],
            "stale_rounds": [r.round for r in result.records if r.stale],
            "seconds": round(time.perf_counter() - started, 1)}


def summarize(runs: list[dict], margin: float) -> dict:
    """Per seed: the target and each policy's time and rounds to it; per policy: mean and spread
    over seeds, and per client how many reached a lower best MASE than synchronous rounds."""
    per_seed = []
    for seed in sorted({r["seed"] for r in runs}):
        group = {r["policy"]: r for r in runs if r["seed"] == seed}
        target = max(min(r["mase"]) for r in group.values()) * (1 + margin)
        reached = {p: next(i for i, m in enumerate(r["mase"]) if m <= target) for p, r in group.items()}
        budget = min(r["closed_at"][-1] for r in group.values())
        per_seed.append({"seed": seed, "target_mase": target,
                         "seconds_to_target": {p: group[p]["closed_at"][i] for p, i in reached.items()},
                         "rounds_to_target": {p: i + 1 for p, i in reached.items()},
                         "best_mase": {p: min(r["mase"]) for p, r in group.items()}, "budget_s": budget,
                         "mase_in_budget": {p: min(m for m, t in zip(r["mase"], r["closed_at"]) if t <= budget)
                                            for p, r in group.items()}})
    policies = {}
    for policy in POLICIES:
        seconds = [s["seconds_to_target"][policy] for s in per_seed]
        policies[policy] = {"seconds_mean": statistics.mean(seconds), "seconds_min": min(seconds),
                            "seconds_max": max(seconds), "seconds_std": statistics.pstdev(seconds),
                            "rounds_mean": statistics.mean(s["rounds_to_target"][policy] for s in per_seed),
                            "best_mase_mean": statistics.mean(s["best_mase"][policy] for s in per_seed),
                            "mase_in_budget_mean": statistics.mean(s["mase_in_budget"][policy] for s in per_seed),
                            "clients_vs_sync_quorum": clients_against(runs, policy, "sync_quorum")}
    return {"per_seed": per_seed, "policies": policies}


def clients_against(runs: list[dict], policy: str, baseline: str) -> dict:
    """Client-seeds whose best validation MASE under ``policy`` is below / above ``baseline``'s."""
    gained = lost = 0
    for run in (r for r in runs if r["policy"] == policy):
        base = next(r for r in runs if r["policy"] == baseline and r["seed"] == run["seed"])
        for client in run["client_mase"][0]:
            mine = min(m[client] for m in run["client_mase"])
            theirs = min(m[client] for m in base["client_mase"])
            gained, lost = gained + (mine < theirs), lost + (mine > theirs)
    return {"gained": gained, "lost": lost}


def markdown(summary: dict) -> str:
    cfg = summary["config"]
    mean_budget = statistics.mean(s["budget_s"] for s in summary["per_seed"])
    lines = [f"# Round policies with a straggler ({cfg['mode']}, commit {cfg['commit'][:12]})", "",
             f"{cfg['clients']} station clients, {cfg['rounds']} rounds, straggler {cfg['straggler']}x, "
             f"seeds {cfg['seeds']}; target = worst best validation MASE + {cfg['target_margin']:.0%} per seed; "
             f"budget = the shortest run's simulated time (mean {mean_budget:.1f} s); clients gained / lost: "
             "client-seeds whose best validation MASE is lower / higher.", "",
             "| policy | simulated s to target (mean, min-max, std) | rounds to target | best val MASE | "
             "best val MASE in the budget | clients gained / lost vs sync_quorum |", "|---|---|---|---|---|---|"]
    for policy, row in summary["policies"].items():
        versus = row["clients_vs_sync_quorum"]
        lines.append(f"| {policy} | {row['seconds_mean']:.1f} ({row['seconds_min']:.1f}-{row['seconds_max']:.1f}, "
                     f"{row['seconds_std']:.1f}) | {row['rounds_mean']:.1f} | {row['best_mase_mean']:.4f} | "
                     f"{row['mase_in_budget_mean']:.4f} | "
                     f"{versus['gained']} / {versus['lost']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = bench_parser(__doc__, "30 rounds, 3 seeds (the full run: 60 rounds, 5 seeds, denser windows)")
    args, cfg, started = configure(parser, QUICK, FULL)
    jobs = [(policy, seed, cfg) for seed in cfg["seeds"] for policy in POLICIES]
    runs = run_parallel(run_job, jobs, args.workers, lambda r: f"{r['policy']} seed {r['seed']}: {r['seconds']} s")
    summary = {**summarize(runs, cfg["target_margin"]), "runs": runs,
               "config": {**run_config(cfg, args.quick, started),
                          "command": "python bench/round_policy.py" + (" --quick" if args.quick else "")}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "round_policy.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (args.out / "round_policy.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
