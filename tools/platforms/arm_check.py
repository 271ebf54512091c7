"""`make arm-check`: `edgefl agent serve` on linux/aarch64 (Python 3.13 of a Debian 13 arm64 root
filesystem under qemu-user) ingests a station replayed on the host, serves an ONNX bundle trained
and exported on the host (x86_64), and publishes a forecast that a host client reads back from a
mosquitto on the host's loopback. Writes bench/results/arm_check.json."""

from __future__ import annotations

import json
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from requirements import BUILD, REPO, SERVE, pins
from rootfs import EMULATED_CPU, chroot_argv, ensure_rootfs, ensure_venv, inside, say, session
from worktree import commit, stage_source

sys.path.insert(0, str(REPO))
from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port  # noqa: E402
from edge_agent.config import AgentConfig, dump_toml, load_config  # noqa: E402
from edge_agent.mqtt import paho_client  # noqa: E402

RESULT = REPO / "bench/results/arm_check.json"
FEATURES = ("temp_air", "relative_humidity", "wind_speed")
ROWS, STATION, FORECASTS = 200, "zigbee2mqtt/amsterdam", "home/amsterdam/forecast"
MODEL = {"backbone": "dlinear", "lookback": 24, "horizon": 12, "d_qap": 16, "qap_heads": 2}
TRAINING = {"local_epochs": 1, "batch_size": 64, "lr": 0.003, "stride": 16, "keep_local": False, "anchors": [],
            "min_steps": 0}
VENV = "edgefl-serve"
DEADLINE_S = 600  # everything under emulation: imports alone take tens of seconds
PROBE = ("import json, platform, sys\nfrom importlib import metadata\n"
         "names = ['edgefl', 'numpy', 'onnxruntime', 'paho-mqtt', 'pydantic', 'pandas', 'torch']\n"
         "def version(n):\n    try:\n        return metadata.version(n)\n    except metadata.PackageNotFoundError:\n"
         "        return None\n"
         "print(json.dumps({'python': platform.python_version(), 'machine': platform.machine(),"
         " 'packages': {n: version(n) for n in names}}))")


class Messages:
    """The payloads a host client receives on ``topic`` (retained ones too), as they arrive."""

    def __init__(self, port: int, topic: str):
        self.seen: list[bytes] = []
        self.arrived = threading.Event()
        self.client = paho_client()
        self.client.on_connect = lambda client, *_: client.subscribe(topic, qos=1)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _client, _userdata, message) -> None:
        self.seen.append(bytes(message.payload))
        self.arrived.set()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait_for(condition, deadline: float, what: str, process: subprocess.Popen, log: Path) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (with the serve log) at the
    deadline or when the serving process has died."""
    while not condition():
        if process.poll() is not None:
            raise RuntimeError(f"edgefl agent serve exited {process.returncode} before {what}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {DEADLINE_S} s:\n{log.read_text()}")
        time.sleep(0.5)


def write_config(work: Path, port: int) -> Path:
    """A head-mode gateway whose sensors are the replayed station; its state folder lies under
    ``work``, which is mounted at the same path inside the root filesystem."""
    features = [{"name": f, "topic": STATION, "path": f, "time_path": "last_seen"} for f in FEATURES]
    data = {"fleet": "arm", "client_id": "client00", "state_dir": str(work / "agent"), "seed": 7, "client_index": 0,
            "data": {"source": "sensors", "gaps": {"fill": "ffill", "max_fill_steps": 2}}, "model": MODEL,
            "training": TRAINING, "broker": {"port": port}, "sensors": {"step": "1h", "broker": {"port": port},
                                                                       "features": features},
            "serving": {"topic": FORECASTS, "every_s": 3600, "stale_after": "2d"}}  # replayed: up to a day old
    path = work / "agent.toml"
    path.write_text(dump_toml(data))
    return path


def stored_rows(database: Path) -> int:
    if not database.exists():
        return 0
    with sqlite3.connect(database) as connection:
        return connection.execute("SELECT COUNT(*) FROM readings WHERE feature = 'temp_air'").fetchone()[0]


def host_bundle(config: Path) -> tuple[dict, float]:
    """Train one round on the readings the aarch64 process stored, export the bundle into its
    serving folder (here, on x86_64), and return the x86_64 ONNX Runtime forecast of the latest
    window and the training + export seconds."""
    from edge_agent.learners import make_learner
    from edge_agent.live import gateway_table
    from edge_agent.serving.onnx_serving import OnnxServing
    from export.bundle import write_bundle

    started = time.monotonic()
    cfg = load_config(config, AgentConfig)
    table = gateway_table(cfg)
    learner = make_learner(cfg, table)
    learner.train(1)
    folder = cfg.state_dir / "serving"
    write_bundle(learner, cfg.client_id, 1, cfg.sensors.step_ns, folder)
    lookback = MODEL["lookback"]
    offline = OnnxServing(folder).forecast(table.index[-lookback:].as_unit("ns").asi8, table.values[-lookback:])
    return offline, time.monotonic() - started


def compare(published: dict, offline: dict) -> float:
    """The largest difference between the aarch64 forecast and the x86_64 one (an error when
    their windows or shapes differ or a value is not finite)."""
    if published["window_end"] != offline["window_end"] or published["times"] != offline["times"]:
        raise AssertionError(f"aarch64 forecast window {published['window_end']} != x86_64 {offline['window_end']}")
    got = np.array([published["forecast"][f]["value"] for f in FEATURES], dtype=np.float64)
    want = np.array([offline["forecast"][f]["value"] for f in FEATURES], dtype=np.float64)
    if got.shape != (len(FEATURES), MODEL["horizon"]) or not np.isfinite(got).all():
        raise AssertionError(f"aarch64 forecast has shape {got.shape} or values that are not finite")
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return float(np.abs(got - want).max())


def serve_and_read_back(root: Path, venv: str, work: Path, port: int) -> dict:
    """Run the check with the broker up; the measured facts."""
    config, log = write_config(work, port), work / "serve.log"
    inside(root, [f"{venv}/bin/pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                  "--force-reinstall", str(work / "src")], cwd="/")
    probe = json.loads(inside(root, [f"{venv}/bin/python", "-c", PROBE], capture_output=True).stdout)
    started = time.monotonic()
    deadline = started + DEADLINE_S
    status = Messages(port, "edgefl/client00-serve-sensors/status")
    with open(log, "w") as out:
        server = subprocess.Popen(chroot_argv(root, [f"{venv}/bin/edgefl", "agent", "serve", "-c", str(config)]),
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"online" in status.seen, deadline, "sensor client online", server, log)
        online_s = time.monotonic() - started
        say(f"aarch64 edgefl agent serve online after {online_s:.1f} s; replaying {ROWS} rows on the host")
        subprocess.run([sys.executable, "-m", "edgefl.cli", "replay", "--site", "amsterdam", "--rows", str(ROWS),
                        "--style", "zigbee2mqtt", "--speedup", "0", "--port", str(port),
                        "--columns", ",".join(FEATURES)], cwd=REPO, check=True, capture_output=True, timeout=300)
        wait_for(lambda: stored_rows(work / "agent/readings.sqlite") == ROWS, deadline, f"{ROWS} stored readings",
                 server, log)
        forecasts = Messages(port, FORECASTS)
        offline, bundle_s = host_bundle(config)
        written = time.monotonic()
        wait_for(forecasts.arrived.is_set, deadline, "forecast message", server, log)
        forecast_s = time.monotonic() - written
        published = json.loads(forecasts.seen[0])
        forecasts.close()
    finally:
        status.close()
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    text = log.read_text()
    if "Traceback" in text or server.returncode != 0:
        raise RuntimeError(f"edgefl agent serve exited {server.returncode}:\n{text}")
    loaded = next(line.split("(loaded: ")[1].rstrip(")") for line in text.splitlines() if "(loaded: " in line)
    return {"probe": probe, "online_s": online_s, "bundle_s": bundle_s, "forecast_s": forecast_s,
            "seconds": time.monotonic() - started, "loaded": loaded, "published": published,
            "max_abs_diff": compare(published, offline)}


def main() -> None:
    began = time.monotonic()
    root = ensure_rootfs("arm64")
    with tempfile.TemporaryDirectory(prefix="edgefl-arm-check-") as tmp:
        work = Path(tmp)
        stage_source(work / "src")
        port = free_port()
        (work / "broker").mkdir()
        broker_config = work / "broker/mosquitto.conf"
        broker_config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
        broker = start_mosquitto(broker_config, work / "broker")
        try:
            wait_for_port(port, broker)
            with session(root, work):
                venv = ensure_venv(root, VENV, pins(SERVE) + list(BUILD))
                facts = serve_and_read_back(root, venv, work, port)
        finally:
            broker.terminate()
            broker.wait(10)
    probe, published = facts["probe"], facts["published"]
    result = {
        "forecast": True, "seconds": round(facts["seconds"], 1),
        "python": probe["python"], "machine": probe["machine"], "emulated_cpu": EMULATED_CPU,
        "command": "make arm-check", "commit": commit(),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "steps_s": {"serve_online": round(facts["online_s"], 1), "x86_64_train_and_export": round(facts["bundle_s"], 1),
                    "bundle_to_forecast": round(facts["forecast_s"], 1), "whole_check": round(time.monotonic() - began, 1)},
        "packages": probe["packages"], "serving_loaded": facts["loaded"],
        "forecast_message": {"topic": FORECASTS, "model": published["model"], "window_end": published["window_end"],
                             "steps": len(published["times"]), "features": sorted(published["forecast"])},
        "max_abs_diff_vs_x86_64": facts["max_abs_diff"],
        "rootfs": f"Debian 13 (trixie) arm64, mmdebstrap + qemu-user-static (binfmt_misc), cached in {root.parent}",
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    say(f"forecast read back from linux/{probe['machine']} Python {probe['python']} in {result['seconds']} s "
        f"(max |aarch64 - x86_64| = {facts['max_abs_diff']:.2e}); wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
