"""Fleet load: N virtual gateways against a real `edgefl coordinator serve` over a real mosquitto.

Per N, a fresh loopback broker (queues sized as `edgefl broker-config` sizes them) and a fresh
coordinator process run ``rounds`` rounds with start_clients = min_clients = N. The gateways
(``bench/fleet_gateways.py``: many connections per process, no torch) register, keep presence
with a Last Will and send one update per round: a head-mode fleet, then a prompt-mode one. A monitor client timestamps the round
announcements and the coordinator's acceptances (sent once an update is durable), so:
spread = first -> last update accepted; ingest = N / (announcement -> last accepted); round
overhead = last accepted -> next announcement (aggregate, persist, announce). Raw mosquitto
throughput for the same message size is measured on the same broker first.

    python bench/fleet_load.py --quick                             # N = 100, 1000 (about 1 min)
    python bench/fleet_load.py --out bench/results/fleet_load_full  # N = 100, 1000, 5000 (about 7 min)
"""

from __future__ import annotations

import math
import multiprocessing
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, bench_parser, configure, run_config, save_figure, write_report
from fleet_gateways import FleetSpec, run_gateways
from fleet_probe import Monitor, ProcessProbe, folder_bytes
from mqtt_bench import loopback_broker, raise_fd_limit, raw_throughput, restamp

MODES = ("head", "prompt")
QUICK = {"agents": [100, 1000], "rounds": 3, "modes": list(MODES), "fractions": [1.0, 0.1]}
FULL = {"agents": [100, 1000, 5000], "rounds": 3, "modes": list(MODES), "fractions": [1.0, 0.1, 0.99]}  # 0.99: 4,950 asked by digest
MODEL = {"backbone": "dlinear", "lookback": 48, "horizon": 24, "d_qap": 16, "qap_heads": 4}  # ~23 KB updates
# Prompt mode (FedPoD's client) around the default foundation model (d_model 64, 2 layers): the
# update is the prompts plus the shared output layer. Aggregated with FedAvg here: FedPoD's graph
# training over N clients is the method's cost, not the service's.
PROMPT = {"lookback": 12, "horizon": 12}
BODIES = 8  # distinct update bodies, so the average is not of identical tensors
GATEWAYS_PER_PROCESS = 1250
TIMEOUT_S = 600


def templates(fleet: str, mode: str = "head", work: Path | None = None) -> tuple[dict, FleetSpec]:
    """The coordinator's fleet settings and the gateways' templates, built once with torch: the
    model signature as the coordinator computes it, updates of the model's real shared state
    (prompt mode: a fresh foundation checkpoint written to ``work``)."""
    import torch

    from coordinator.config import CoordinatorConfig
    from edge_agent.learners import fleet_template
    from edge_agent.protocol import PLACEHOLDER_DIGEST, HelloHeader, UpdateHeader, decode, encode

    fleet_model = {"model": MODEL} if mode == "head" else prompt_fleet(work)
    cfg = CoordinatorConfig(fleet=fleet, state_dir=Path("unused"), **fleet_model)
    template = fleet_template(cfg, cfg.seed)
    hello = encode(HelloHeader(fleet=fleet, sender="template", n_features=1, n_samples=1000,
                               model_signature=template.signature))
    generator = torch.Generator().manual_seed(0)
    updates = tuple(
        encode(UpdateHeader(fleet=fleet, sender="template", round=1, n_samples=1000,
                            metrics={"train_loss": 0.4, "val_loss": 0.5}, global_sha256=PLACEHOLDER_DIGEST),
               {k: v + 0.01 * torch.randn(v.shape, generator=generator) for k, v in template.initial.items()})
        for _ in range(BODIES))
    spec = FleetSpec(0, fleet, hello, updates)
    check_worker_envelopes(spec, decode)
    return {**fleet_model, "seed": cfg.seed}, spec


def prompt_fleet(work: Path) -> dict:
    """Prompt-mode settings around a freshly initialised foundation checkpoint in ``work``."""
    import torch

    from edge_agent.models.foundation import FoundationModel, save_foundation
    from edge_agent.models.foundation_config import FoundationConfig

    torch.manual_seed(0)
    path = work / "foundation.safetensors"
    digest = save_foundation(FoundationModel(FoundationConfig()), path)
    return {"mode": "prompt", "strategy": "fedavg", "foundation": str(path), "foundation_sha256": digest,
            "prompt": PROMPT}


def check_worker_envelopes(spec: FleetSpec, decode) -> None:
    """The gateways' re-stamped messages pass the protocol's own ``decode``."""
    header, _ = decode(restamp(spec.hello, sender="gw00001"), 1 << 30)
    assert header.sender == "gw00001"
    header, tensors = decode(restamp(spec.updates[-1], sender="gw00001", round=3, campaign="c1"), 1 << 30)
    assert (header.sender, header.round, header.campaign) == ("gw00001", 3, "c1") and tensors


def coordinator_toml(work: Path, port: int, agents: int, rounds: int, fleet_model: dict, fleet: str,
                     fraction: float = 1.0, **overrides: object) -> Path:
    """Round 1 waits for every gateway; each round asks ``fraction`` of them (the round policy)
    and needs all it asked (``overrides``: other settings, e.g. ``bench/soak.py``'s deployment)."""
    from edge_agent.config import dump_toml

    data = {"fleet": fleet, "state_dir": str(work / "state"), "rounds": rounds,
            "min_clients": math.ceil(fraction * agents), "start_clients": agents, "round_timeout_s": float(TIMEOUT_S),
            "linger_s": 10.0, "participation": {"fraction": fraction, "quorum": 1.0}, **fleet_model,
            "broker": {"port": port}, **overrides}
    path = work / "coordinator.toml"
    path.write_text(dump_toml(data))
    return path


def start_gateways(spec: FleetSpec, agents: int, report) -> list[multiprocessing.Process]:
    """Spawned processes of at most ``GATEWAYS_PER_PROCESS`` gateways each (spawn: no torch)."""
    context = multiprocessing.get_context("spawn")
    ids = [f"gw{i:05d}" for i in range(agents)]
    shares = math.ceil(agents / GATEWAYS_PER_PROCESS)
    processes = [context.Process(target=run_gateways, args=(spec, ids[k::shares], report, TIMEOUT_S), daemon=True)
                 for k in range(shares)]
    for process in processes:
        process.start()
    return processes


def collect(report, processes: list, wait_s: float) -> dict:
    """The gateways' reports: join time and summed reply tallies."""
    tally: dict[str, int] = {}
    torch_loaded, connect_s = False, 0.0
    deadline = time.monotonic() + wait_s
    for _ in range(2 * len(processes)):
        try:
            kind, first, second = report.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:  # a gateway process did not finish in time
            break
        if kind == "connected":
            connect_s = max(connect_s, second)
        else:
            tally = {k: tally.get(k, 0) + first.get(k, 0) for k in {*tally, *first}}
            torch_loaded |= second
    for process in processes:
        process.join(5)
        if process.is_alive():
            process.kill()
    return {"gateway_replies": dict(sorted(tally.items())), "connect_s": round(connect_s, 2),
            "torch_in_gateways": torch_loaded}


def run_fleet(agents: int, rounds: int, fleet_model: dict, spec: FleetSpec, work: Path,
              profile: Path | None = None, fraction: float = 1.0) -> dict:
    """One N: raw throughput, then the fleet's rounds (each asking ``fraction`` of the gateways),
    timed and measured (with ``profile``, the coordinator runs under pyinstrument and its text
    report is written there)."""
    from coordinator.broker_setup import MIN_QUEUED, QUEUED_PER_AGENT
    from edge_agent.broker_settings import COORDINATOR_RECEIVE_WINDOW

    size = len(spec.updates[0])
    with loopback_broker(work, max(MIN_QUEUED, QUEUED_PER_AGENT * agents), COORDINATOR_RECEIVE_WINDOW) as (port, bpid):
        raw = raw_throughput(port, max(1000, min(agents, 5000)), size)
        spec = FleetSpec(port, spec.fleet, spec.hello, spec.updates)
        monitor = Monitor(port, spec.fleet)
        log = open(work / "coordinator.log", "w")
        coordinator = subprocess.Popen(
            [sys.executable, *profiler(profile, agents), "-m", "edgefl.cli", "coordinator", "serve", "--config",
             str(coordinator_toml(work, port, agents, rounds, fleet_model, spec.fleet, fraction))],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        probes = {"coordinator": ProcessProbe(coordinator.pid), "broker": ProcessProbe(bpid)}
        try:
            monitor.wait_online(120)
            report = multiprocessing.get_context("spawn").Queue()
            started = time.monotonic()
            processes = start_gateways(spec, agents, report)
            finished = monitor.wait_finished(TIMEOUT_S)
            gateways = collect(report, processes, 60 if finished else 5)
            coordinator.wait(60 if finished else 1)
        finally:
            if coordinator.poll() is None:
                coordinator.kill()
                coordinator.wait()
            log.close()
            monitor.stop()
            for probe in probes.values():
                probe.stop()
    row = {"fraction": fraction, **measures(agents, rounds, size, raw, monitor, probes, started)}
    row.update(gateways, store_mb=round(folder_bytes(work / "state") / 1e6, 1), completed=row["completed"] and finished)
    if not row["completed"]:
        ended = "the fleet finished" if finished else f"no finished announcement within {TIMEOUT_S} s"
        row["what_happened"] = f"{ended}; coordinator log ends: {(work / 'coordinator.log').read_text()[-1200:]}"
    return row


def profiler(folder: Path | None, agents: int) -> list[str]:
    """The interpreter options that run the coordinator under pyinstrument (none without a folder)."""
    if folder is None:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    return ["-m", "pyinstrument", "-r", "text", "-o", str(folder / f"coordinator_{agents}.txt")]


def measures(agents: int, expected: int, size: int, raw: float, monitor: Monitor, probes: dict, started: float) -> dict:
    """The row of one N from the monitor's timestamps and the process probes."""
    announced, accepted = monitor.announced, monitor.accepted
    rounds = sorted(r for r in accepted if len(accepted[r]) == monitor.asked.get(r, agents) and r + 1 in announced)
    round_s = [announced[r + 1] - announced[r] for r in rounds]
    ingest = [max(accepted[r]) - announced[r] for r in rounds]
    spread = [(max(accepted[r]) - min(accepted[r])) * 1000 for r in rounds]
    overhead = [(announced[r + 1] - max(accepted[r])) * 1000 for r in rounds]
    coordinator, broker = probes["coordinator"], probes["broker"]
    first, last = announced.get(1, started), announced.get(max(announced, default=1), time.monotonic())
    ingest_s = statistics.median(ingest) if ingest else None
    updates = statistics.median(len(accepted[r]) for r in rounds) if rounds else agents  # per round
    return {
        "agents": agents, "completed": len(rounds) == expected, "rounds_completed": len(rounds),
        "accepted_per_round": {r: len(times) for r, times in sorted(accepted.items())},
        "update_bytes": size, "join_s": round(first - started, 2),
        "ingest_updates_s": round(updates / ingest_s, 1) if ingest_s else None,
        "ingest_mb_s": round(updates * size / ingest_s / 1e6, 2) if ingest_s else None,
        "raw_mb_s": round(raw, 1), "raw_updates_s": round(raw * 1e6 / size, 1),
        "round_overhead_ms": round(statistics.median(overhead), 1) if overhead else None,
        "round_s": round(statistics.median(round_s), 3) if round_s else None,
        "asked_per_round": dict(sorted(monitor.asked.items())),
        "first_to_last_update_ms": [round(x, 1) for x in spread], "ingest_s_per_round": [round(x, 3) for x in ingest],
        "round_overhead_ms_per_round": [round(x, 1) for x in overhead],
        "rss_mb": coordinator.hwm_mb, "rss_end_mb": coordinator.rss_mb, "cpu_s": coordinator.cpu_s(),
        "cpu_s_rounds": coordinator.cpu_between(first, last), "broker_cpu_s_rounds": broker.cpu_between(first, last),
        "broker_rss_mb": broker.hwm_mb, "rejected": monitor.rejected,
    }


def table(summary: dict) -> str:
    """The rows as a markdown table."""
    head = ("mode", "agents", "fraction", "asked", "done", "KB", "round s", "ingest upd/s", "ingest MB/s", "raw MB/s",
            "overhead ms", "spread ms", "RSS MB", "CPU s", "store MB")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in summary["rows"]:
        spread = max(r["first_to_last_update_ms"], default=None)
        asked = sorted(set(r.get("asked_per_round", {}).values())) or [r["agents"]]
        lines.append(" | ".join(str(x) for x in (
            r.get("mode", "head"), r["agents"], r.get("fraction", 1.0), "/".join(map(str, asked)), r["completed"],
            round(r["update_bytes"] / 1e3, 1), r.get("round_s"), r["ingest_updates_s"], r["ingest_mb_s"], r["raw_mb_s"],
            r["round_overhead_ms"], spread and round(spread), r["rss_mb"], r["cpu_s"], r["store_mb"])))
    return "\n".join(lines)


def plot(summary: dict, path: Path) -> None:
    """Round overhead and ingest (with the raw broker rate for the same message size) against N,
    for the N whose rounds completed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode, marker in zip(MODES, "os"):
        rows = [r for r in summary["rows"] if r.get("mode", "head") == mode and r["round_overhead_ms"] is not None
                and r.get("fraction", 1.0) == 1.0]
        if not rows:
            continue
        n, size = [r["agents"] for r in rows], f"{rows[0]['update_bytes'] / 1e3:.0f} KB"
        left.plot(n, [r["round_overhead_ms"] for r in rows], f"{marker}-", label=f"{mode} ({size})")
        right.plot(n, [r["ingest_updates_s"] for r in rows], f"{marker}-", label=f"coordinator, {mode} ({size})")
        right.plot(n, [r["raw_updates_s"] for r in rows], f"{marker}--", alpha=0.6, label=f"raw mosquitto, {size}")
    left.set(xscale="log", yscale="log", xlabel="gateways", ylabel="round overhead (ms)", title="last update stored -> next round")
    left.legend()
    right.set(xscale="log", yscale="log", xlabel="gateways", ylabel="updates/s", title="ingest")
    right.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = bench_parser(__doc__, "N = 100 and 1000 only")
    parser.add_argument("--agents", type=lambda text: [int(n) for n in text.split(",")],
                        help="the fleet sizes to run instead, e.g. 1000 or 100,2000")
    parser.add_argument("--profile", type=Path, metavar="FOLDER",
                        help="run the coordinator under pyinstrument (pip install pyinstrument); reports go here")
    args, cfg, started = configure(parser, QUICK, FULL)
    cfg["agents"] = args.agents or cfg["agents"]
    cfg.update(fd_limit=raise_fd_limit(), load_average_before=os.getloadavg())
    rows = []
    for mode in cfg["modes"]:
        for agents in cfg["agents"]:
            for fraction in cfg["fractions"]:
                with tempfile.TemporaryDirectory() as tmp:
                    fleet_model, spec = templates(f"load{agents}", mode, Path(tmp))
                    row = run_fleet(agents, cfg["rounds"], fleet_model, spec, Path(tmp), args.profile, fraction)
                    rows.append({"mode": mode, **row})
                print(table({"rows": rows[-1:]}).splitlines()[-1], flush=True)
    cfg.update(model=MODEL, prompt=PROMPT, load_average_after=os.getloadavg(), gateways_per_process=GATEWAYS_PER_PROCESS, timeout_s=TIMEOUT_S, distinct_bodies=BODIES)
    summary = {"rows": rows, "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "fleet_load", summary, table, plot)


if __name__ == "__main__":
    main()
