"""Transport benchmark on loopback through a real mosquitto, all numbers from one run.

1. raw paho throughput: N x 100 KB messages at QoS 1, one publisher, one subscriber;
2. coordinator ingest: 50 publisher processes each send one update (about 100 KB, then about
   1 MB) per round; ingest = bytes / (announcement -> last update stored), which covers decode,
   validation, durable persistence and the per-message round check; aggregation is measured
   as round overhead = last update stored -> next round announced (aggregate + persist + announce).

    python bench/transport.py --quick     # 1000 raw messages, 2 rounds per size
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import commit  # noqa: E402
from mqtt_bench import envelope_header, loopback_broker, raw_throughput, restamp  # noqa: E402

from edge_agent.mqtt import paho_client  # noqa: E402

SIZES = {"100KB": 40, "1MB": 156}  # d_qap giving shared states of ~104 KB and ~1.0 MB (DLinear, L96 H48)


def publisher_process(
    port: int, fleet: str, client_id: str, hello: bytes, updates: dict[int, bytes], ready
) -> None:
    """A lightweight agent (paho only, no torch): says hello when the coordinator is online, then
    answers each round announcement with its pre-encoded update, bound to that announcement."""
    root = f"edgefl/{fleet}"
    done = threading.Event()
    client = paho_client(client_id)

    def on_message(c, _u, message) -> None:
        if message.topic == f"{root}/coordinator/status":
            if message.payload == b"online":
                c.publish(f"{root}/agents/{client_id}/hello", hello, qos=1)
            return
        header = envelope_header(bytes(message.payload))
        if header["finished"]:
            done.set()
        elif header["round"] in updates:
            update = restamp(updates.pop(header["round"]), global_sha256=header["body_sha256"])
            c.publish(f"{root}/agents/{client_id}/update", update, qos=1)

    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.subscribe([(f"{root}/round", 1), (f"{root}/coordinator/status", 1)])
    client.loop_start()
    time.sleep(0.5)
    ready.release()
    done.wait(600)
    client.disconnect()
    client.loop_stop()


def ingest(port: int, fleet: str, workdir: Path, d_qap: int, clients: int, rounds: int) -> dict:
    """Run a coordinator in this process against ``clients`` publisher processes."""
    import torch

    from coordinator.config import CoordinatorConfig
    from coordinator.server import Coordinator
    from edge_agent.protocol import PLACEHOLDER_DIGEST, HelloHeader, UpdateHeader, encode

    model = {"backbone": "dlinear", "lookback": 96, "horizon": 48, "d_qap": d_qap, "qap_heads": 4}
    cfg = CoordinatorConfig(
        fleet=fleet, state_dir=workdir, rounds=rounds, min_clients=clients, round_timeout_s=600,
        model=model, broker={"port": port}, linger_s=0,
    )
    times: dict[str, list[float]] = {"accepted": [], "announced": []}
    coordinator = Coordinator(cfg, on_event=lambda kind, _d: kind in times and times[kind].append(time.perf_counter()))
    state = coordinator.initial
    update_bytes = len(encode(UpdateHeader(fleet=fleet, sender="x", round=1, n_samples=1,
                                           global_sha256=PLACEHOLDER_DIGEST), state))
    context = multiprocessing.get_context("spawn")
    ready = context.Semaphore(0)
    processes = []
    for i in range(clients):
        cid = f"pub{i:02d}"
        hello = encode(HelloHeader(fleet=fleet, sender=cid, n_features=1, n_samples=100,
                                   model_signature=coordinator.signature))
        noisy = {k: v + torch.randn_like(v) * 0.01 for k, v in state.items()}
        updates = {r: encode(UpdateHeader(fleet=fleet, sender=cid, round=r, n_samples=100,
                                          campaign=coordinator.campaign, global_sha256=PLACEHOLDER_DIGEST), noisy)
                   for r in range(1, rounds + 1)}
        process = context.Process(target=publisher_process, args=(port, fleet, cid, hello, updates, ready))
        process.start()
        processes.append(process)
    for _ in processes:
        ready.acquire()
    time.sleep(1.0)
    serve = threading.Thread(target=coordinator.serve)
    serve.start()
    serve.join()
    for process in processes:
        process.join(60)
    announced, accepted = times["announced"], times["accepted"]
    per_round = [accepted[r * clients:(r + 1) * clients] for r in range(rounds)]
    ingest_s = [batch[-1] - announced[r] for r, batch in enumerate(per_round)]
    first_ms = [(batch[0] - announced[r]) * 1000 for r, batch in enumerate(per_round)]
    spread_ms = [(batch[-1] - batch[0]) * 1000 for batch in per_round]
    overhead_ms = [(announced[r + 1] - batch[-1]) * 1000 for r, batch in enumerate(per_round)]
    return {
        "update_bytes": update_bytes,
        "ingest_mb_s": clients * update_bytes / min(ingest_s) / 1e6,
        "ingest_seconds_per_round": ingest_s,
        "announcement_to_first_update_ms": first_ms,
        "first_to_last_update_ms": spread_ms,
        "round_overhead_ms": overhead_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1000 raw messages, 2 rounds per size")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    count, rounds = (1000, 2) if args.quick else (5000, 5)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, loopback_broker(Path(tmp), 100_000) as (port, _):
        work = Path(tmp)
        raw = raw_throughput(port, count, 100_000)
        print(f"raw paho QoS 1: {count} x 100 KB at {raw:.1f} MB/s", flush=True)
        results = {}
        for label, d_qap in SIZES.items():
            fleet = f"bench{label}"
            results[label] = ingest(port, fleet, work / fleet, d_qap, args.clients, rounds)
            r = results[label]
            print(f"ingest {label} ({r['update_bytes']} B x {args.clients}): {r['ingest_mb_s']:.1f} MB/s, "
                  f"round overhead {max(r['round_overhead_ms']):.0f} ms", flush=True)
    summary = {
        "raw_mb_s": raw,
        "ingest_mb_s": {k: v["ingest_mb_s"] for k, v in results.items()},
        "round_overhead_ms": max(results["1MB"]["round_overhead_ms"]),
        "details": results,
        "config": {"mode": "quick" if args.quick else "full", "raw_messages": count, "clients": args.clients,
                   "rounds": rounds, "sizes_d_qap": SIZES, "cpu_count": os.cpu_count(),
                   "wall_seconds": round(time.perf_counter() - started, 1), "commit": commit()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transport.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: summary[k] for k in ("raw_mb_s", "ingest_mb_s", "round_overhead_ms")}, indent=2))


if __name__ == "__main__":
    main()
