"""One device with valid credentials storms the coordinator with hellos (issue 27): how many it
pushes per second, how many event rows and store bytes they leave, and how long the
coordinator takes to get through them. A real mosquitto (queues big enough to hold the storm)
and a real ``edgefl coordinator serve`` (SQLite); no agent, round 1 stays open.

    python bench/storm.py --seconds 10      # prints one JSON object
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port  # noqa: E402
from coordinator.config import CoordinatorConfig  # noqa: E402
from edge_agent.config import dump_toml  # noqa: E402
from edge_agent.learners import fleet_template  # noqa: E402
from edge_agent.mqtt import paho_client  # noqa: E402
from edge_agent.protocol import HelloHeader, encode  # noqa: E402
from edge_agent.topics import Topics

MODEL = {"backbone": "dlinear", "lookback": 24, "horizon": 12, "d_qap": 16, "qap_heads": 2}
DEVICE = "storm"


def event_rows(database: Path) -> int:
    with sqlite3.connect(database, timeout=30) as db:
        return db.execute("SELECT COUNT(*) FROM events").fetchone()[0]


def store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file())


def storm(work: Path, seconds: float) -> dict:
    port = free_port()
    (work / "broker.conf").write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n"
                                      "max_queued_messages 1000000\nmax_queued_bytes 0\n")
    broker = start_mosquitto(work / "broker.conf", work)
    wait_for_port(port, broker)
    data = {"fleet": "storm", "state_dir": str(work / "state"), "rounds": 1, "round_timeout_s": 3600.0,
            "model": MODEL, "broker": {"port": port}, "linger_s": 0.0}
    (work / "coordinator.toml").write_text(dump_toml(data))
    log = open(work / "coordinator.log", "w")
    coordinator = subprocess.Popen([sys.executable, "-m", "edgefl.cli", "coordinator", "serve", "-c",
                                    str(work / "coordinator.toml")], stdout=log, stderr=subprocess.STDOUT)
    database = work / "state" / "coordinator.sqlite3"
    try:
        signature = fleet_template(CoordinatorConfig(**data), 42).signature
        hello = encode(HelloHeader(fleet="storm", sender=DEVICE, n_features=1, n_samples=50,
                                   model_signature=signature))
        client = paho_client("storm-device")
        client.connect("127.0.0.1", port)
        client.loop_start()
        while not database.exists() or event_rows(database) == 0:  # until the coordinator took a hello
            client.publish(Topics("storm").agent(DEVICE, "hello"), hello, qos=1).wait_for_publish(10)
            time.sleep(0.5)
        rows_before, bytes_before = event_rows(database), store_bytes(work / "state")
        sent, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            info = client.publish(Topics("storm").agent(DEVICE, "hello"), hello, qos=1)
            sent += 1
            if sent % 200 == 0:
                info.wait_for_publish(30)
        info.wait_for_publish(60)
        pushed_s = time.monotonic() - started
        rows, stable_since = event_rows(database), time.monotonic()
        while time.monotonic() - stable_since < 3:  # the coordinator works through its queue
            time.sleep(0.5)
            now = event_rows(database)
            if now != rows:
                rows, stable_since = now, time.monotonic()
        drained_s = stable_since - started
        client.loop_stop()
        client.disconnect()
        return {"seconds": round(pushed_s, 1), "hellos_sent": sent, "hellos_per_s": round(sent / pushed_s),
                "event_rows_added": rows - rows_before, "store_bytes_added": store_bytes(work / "state") - bytes_before,
                "coordinator_busy_s": round(drained_s, 1)}
    finally:
        coordinator.terminate()
        coordinator.wait(30)
        broker.terminate()
        broker.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the device storms")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        print(json.dumps(storm(Path(work), args.seconds)))


if __name__ == "__main__":
    main()
