"""Soak: 1,000 virtual gateways against a real coordinator for 30 minutes with churn, once clean
and once hostile, in one invocation (issue 27, item 6).

Each run gets a fresh loopback mosquitto and a fresh ``edgefl coordinator serve`` configured as a
deployment would be (``deployment``: an open-ended campaign, every online gateway asked each
round, quorum 80% + grace, a round deadline, silent clients excluded after 3 missed rounds, update
bodies of the last 3 rounds and records of the last ``KEEP_RECORDS`` kept, the default intake
rate limits). The gateways
(``bench/soak_fleet.py``) train for up to ``train_s`` before answering, and 10% of them drop
(Last Will) and reconnect on their persistent session every minute. The hostile run replaces three
of them by one silent-online device, one storming device (reconnect + hello storm with its own
valid credentials) and one below-screen sign flipper (``coordinator.simulation.attacks``'
``below_screen``: its delta from the fleet's steady global, reversed at 3x, every round; the
virtual gateways do not train, so the steady global is the mean of their update bodies).

Per run: ``rounds`` closed during the soak and their duration (announcement to close, from the
store) at p50 / p99; ``updates_lost``: updates a gateway published that are neither in the
coordinator's store (on time or late) nor answered with a refusal code, after a drain in which
every gateway is reconnected and waits for its answers; ``store_mb``: the state folder every
``SAMPLE_EVERY_S`` from the first announcement; ``rss_mb_max``: the coordinator's peak RSS;
``refused_by_code``: the store's refusal events by code (``rate_limited`` rows count the messages
dropped they report; drops in the last report interval of the run, at most
``intake.report_every_s``, are not yet written and not counted). ``checks``: issue 27's
done-means, computed and reported as measured.

    python bench/soak.py --quick                   # 200 gateways, 3 minutes per run (about 7 min)
    python bench/soak.py                           # 1,000 gateways, 30 minutes per run (about 62 min)
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, replace
from pathlib import Path

from common import ROOT, bench_parser, configure, panel_row, run_config, save_figure, write_report
from fleet_gateways import FleetSpec
from fleet_load import GATEWAYS_PER_PROCESS, MODEL, collect, coordinator_toml, templates
from fleet_probe import Monitor, ProcessProbe, folder_bytes
from mqtt_bench import loopback_broker, raise_fd_limit
from soak_fleet import SoakPlan, run_soak_gateways
from soak_measures import checks, measures

QUICK = {"agents": 200, "minutes": 3.0}
FULL = {"agents": 1000, "minutes": 30.0}
RUNS = ("clean", "hostile")
HOSTILE = {"hostile-silent": "silent", "hostile-storm": "storm", "hostile-flipper": "flipper"}
SAMPLE_EVERY_S = 30.0
# Records of the last 60 rounds: about 10 minutes at the soak's round rate, so that record
# retention applies within a run (the default, 1,000 rounds, would apply after about 3 hours).
KEEP_RECORDS = 60


def deployment(agents: int, keep_records: int = KEEP_RECORDS) -> dict:
    """The coordinator's settings besides fleet, model and broker, as a deployment would set them."""
    from edge_agent.protocol import MAX_ROUND

    return {"rounds": MAX_ROUND, "min_clients": math.ceil(agents / 2), "start_clients": agents,
            "round_timeout_s": 120.0, "linger_s": 0.0, "store": {"keep_rounds": 3, "keep_records": keep_records},
            "participation": {"fraction": 1.0, "quorum": 0.8, "grace": 0.5, "exclude_after": 3}}


def flipped_update(spec: FleetSpec) -> bytes:
    """The sign flipper's update envelope: the first body's delta from the mean of all bodies
    (the global the virtual fleet settles on), reversed at ``BELOW_SCREEN_BOOST`` times its norm."""
    import torch

    from coordinator.simulation.attacks import ATTACKS
    from coordinator.strategies import ClientUpdate
    from edge_agent.protocol import decode, encode

    decoded = [decode(update, 1 << 30) for update in spec.updates]
    header, own = decoded[0]
    steady = {k: torch.stack([body[k] for _, body in decoded]).mean(0) if t.is_floating_point() else t
              for k, t in own.items()}
    return encode(header, ATTACKS["below_screen"].upload(ClientUpdate("flipper", own, header.n_samples), steady).params)


def start_gateways(spec: FleetSpec, plan: SoakPlan, agents: int, roles: dict[str, str], flipped: bytes,
                   channels: tuple, work: Path) -> list:
    """Spawned gateway processes: the honest ones in shares of ``GATEWAYS_PER_PROCESS``, the hostile
    ones in a process of their own (a storm must not slow honest gateways down on their side)."""
    context = multiprocessing.get_context("spawn")
    honest = [f"gw{i:05d}" for i in range(agents - len(roles))]
    shares = math.ceil(len(honest) / GATEWAYS_PER_PROCESS)
    groups = [honest[k::shares] for k in range(shares)] + ([list(roles)] if roles else [])
    processes = [context.Process(target=run_soak_gateways, daemon=True, args=(
        spec, plan, ids, roles, flipped, *channels, str(work / f"ledger{k}.json"))) for k, ids in enumerate(groups)]
    for process in processes:
        process.start()
    return processes


def sample(name: str, seconds: float, monitor: Monitor, probe: ProcessProbe, state: Path,
           seen: dict[str, set[int]]) -> list[float]:
    """The store's size every ``SAMPLE_EVERY_S`` from now to ``seconds``, with a progress line
    each; the update rows it holds at each sample go into ``seen`` (``recorded``)."""
    started, store_mb = time.monotonic(), []
    for k in range(int(seconds // SAMPLE_EVERY_S) + 1 + (seconds % SAMPLE_EVERY_S > 0)):
        time.sleep(max(0.0, started + min(k * SAMPLE_EVERY_S, seconds) - time.monotonic()))
        store_mb.append(round(steady_bytes(state) / 1e6, 2))
        recorded(state, seen)
        print(f"[{name}] {(time.monotonic() - started) / 60:4.1f}/{seconds / 60:.0f} min: "
              f"{len(monitor.announced)} rounds announced, store {store_mb[-1]} MB, coordinator RSS {probe.rss_mb} MB, "
              f"refusals {dict(monitor.rejected)}", flush=True)
    return store_mb


def recorded(state: Path, seen: dict[str, set[int]]) -> None:
    """Add the (client, round) of every update row the store holds now, read-only: the rows of
    rounds that ``keep_records`` forgets later are counted while they are there."""
    import sqlite3

    path = state / "coordinator.sqlite3"
    if not path.exists():
        return
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        for number, client in db.execute("SELECT round, client_id FROM updates"):
            seen[client].add(number)


def steady_bytes(folder: Path) -> int:
    """``folder_bytes``, tried again when a file (an SQLite journal) vanished while it was counted."""
    for _ in range(5):
        try:
            return folder_bytes(folder)
        except FileNotFoundError:
            continue
    return folder_bytes(folder)


def run_soak(name: str, agents: int, seconds: float, plan: SoakPlan, fleet_model: dict, spec: FleetSpec,
             work: Path, keep_records: int = KEEP_RECORDS) -> dict:
    """One run: broker, coordinator, gateways; the soak, then the drain; its measures."""
    from coordinator.broker_setup import MIN_QUEUED, QUEUED_PER_AGENT
    from edge_agent.broker_settings import COORDINATOR_RECEIVE_WINDOW

    roles = HOSTILE if name == "hostile" else {}
    flipped = flipped_update(spec) if roles else b""
    context = multiprocessing.get_context("spawn")
    channels = (context.Queue(), context.Event())
    with loopback_broker(work, max(MIN_QUEUED, QUEUED_PER_AGENT * agents), COORDINATOR_RECEIVE_WINDOW) as (port, _):
        spec = replace(spec, port=port)
        settings = deployment(agents, keep_records)
        toml = coordinator_toml(work, port, agents, settings.pop("rounds"), fleet_model, spec.fleet, **settings)
        monitor, log = Monitor(port, spec.fleet), open(work / "coordinator.log", "w")
        coordinator = subprocess.Popen([sys.executable, "-m", "edgefl.cli", "coordinator", "serve", "--config", str(toml)],
                                       stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        probe = ProcessProbe(coordinator.pid, every_s=1.0)
        try:
            monitor.wait_online(120)
            processes = start_gateways(spec, plan, agents, roles, flipped, channels, work)
            first = wait_first_round(monitor, coordinator)
            seen: dict[str, set[int]] = defaultdict(set)
            store_mb = sample(name, seconds, monitor, probe, work / "state", seen)
            until = time.time()
            channels[1].set()
            gateways = collect(channels[0], processes, plan.drain_s + 60)
            survived = coordinator.poll() is None
        finally:
            stop(coordinator)
            log.close()
            monitor.stop()
            probe.stop()
    ended = {} if survived else {"coordinator_log_end": (work / "coordinator.log").read_text()[-1500:]}
    return {**measures(work, first, until, roles, seen), "store_mb": store_mb, "store_every_s": SAMPLE_EVERY_S,
            "rss_mb_max": probe.hwm_mb, "rss_mb_end": probe.rss_mb, "coordinator_survived": survived, **ended,
            **gateways}


def wait_first_round(monitor: Monitor, coordinator: subprocess.Popen, timeout_s: float = 600) -> float:
    """Wall-clock time when round 1 was announced (every gateway registered)."""
    deadline = time.monotonic() + timeout_s
    while 1 not in monitor.announced:
        if coordinator.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("round 1 was not announced (see coordinator.log)")
        time.sleep(0.2)
    return time.time() - (time.monotonic() - monitor.announced[1])


def stop(coordinator: subprocess.Popen) -> None:
    """SIGTERM (the service's clean stop), a kill if it does not stop within a minute."""
    if coordinator.poll() is None:
        coordinator.send_signal(signal.SIGTERM)
        try:
            coordinator.wait(60)
        except subprocess.TimeoutExpired:
            coordinator.kill()
            coordinator.wait()


def table(summary: dict) -> str:
    """The runs and the checks as markdown."""
    head = ("run", "agents", "minutes", "rounds", "round p50 s", "round p99 s", "updates lost", "store MB (half -> last)",
            "coordinator RSS max MB", "refused by code")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cfg = summary["config"]
    for name in RUNS:
        if (run := summary.get(name)) is None:
            continue
        store = run["store_mb"]
        lines.append("| " + " | ".join(str(x) for x in (
            name, cfg["agents"], round(cfg["duration_s"] / 60, 1), run["rounds"], run["round_p50_s"], run["round_p99_s"],
            run["updates_lost"], f"{store[(len(store) - 1) // 2]} -> {store[-1]}", run["rss_mb_max"],
            ", ".join(f"{k} {v}" for k, v in run["refused_by_code"].items()) or "-")) + " |")
    lines += ["", "| check | ok | numbers |", "|---|---|---|"]
    for name, check in summary["checks"].items():
        if isinstance(check, dict):
            lines.append(f"| {name} | {check['ok']} | " + ", ".join(f"{k} {v}" for k, v in check.items() if k != "ok")
                         + " |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    """The store's size and each round's duration over the soak, per run."""
    fig, (store, rounds) = panel_row(2, 5.5)
    for name in RUNS:
        if (run := summary.get(name)) is None:
            continue
        store.plot([k * run["store_every_s"] / 60 for k in range(len(run["store_mb"]))], run["store_mb"], "o-", label=name)
        if run["round_s_over_time"]:
            rounds.plot(*zip(*run["round_s_over_time"]), ".", alpha=0.6, label=name)
    store.set(xlabel="minutes", ylabel="state folder (MB)", title="store")
    rounds.set(xlabel="minutes (round opened)", ylabel="round duration (s)", title="rounds")
    for axis in (store, rounds):
        axis.legend()
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "200 gateways, 3 minutes per run")
    parser.add_argument("--agents", type=int, help="gateways per run (default 1000; 200 with --quick)")
    parser.add_argument("--minutes", type=float, help="soak per run (default 30; 3 with --quick)")
    parser.add_argument("--only", choices=RUNS, help="one run instead of both")
    parser.add_argument("--train-s", type=float, default=SoakPlan.train_s, help="longest training time of a gateway")
    parser.add_argument("--keep-records", type=int, default=KEEP_RECORDS, help="rounds of records the store keeps")
    args, cfg, started = configure(parser, QUICK, FULL)
    agents, seconds = args.agents or cfg["agents"], 60 * (args.minutes or cfg["minutes"])
    plan = SoakPlan(train_s=args.train_s)
    cfg = {"agents": agents, "duration_s": seconds, "plan": asdict(plan), "hostile_roles": HOSTILE,
           "coordinator": deployment(agents, args.keep_records), "intake": intake_defaults(), "sample_every_s": SAMPLE_EVERY_S, "model": MODEL,
           "fd_limit": raise_fd_limit(), "load_average_before": os.getloadavg()}
    runs = {}
    for name in [args.only] if args.only else RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            fleet_model, spec = templates(f"soak{name}")
            runs[name] = run_soak(name, agents, seconds, plan, fleet_model, spec, Path(tmp), args.keep_records)
        print(f"[{name}] done: " + json.dumps({k: runs[name][k] for k in ("rounds", "round_p50_s", "round_p99_s",
                                                                         "updates_lost", "rss_mb_max")}), flush=True)
    summary = {"config": run_config({**cfg, "load_average_after": os.getloadavg()}, args.quick, started), **runs,
               "checks": checks(runs)}
    print(json.dumps(summary["checks"]), flush=True)
    write_report(args.out, "soak", summary, table, plot)


def intake_defaults() -> dict:
    """The intake rate limits the coordinator runs with (its defaults), for the results' config."""
    from coordinator.throttle import IntakeLimits

    return IntakeLimits().model_dump()


if __name__ == "__main__":
    main()
