"""Footprint of a live gateway (issues 15 and 28), all numbers from one run over a real mosquitto.

A gateway on the bundled Amsterdam station (3 features, replayed as zigbee2mqtt readings, the
default head-mode model) is measured as three processes:

1. ``edgefl agent run``, idle: connected, its history adopted (its model's facts learned from a
   child process, ``edge_agent.model_facts``, which exits: the agent never loads torch), no round
   yet: resident memory (VmRSS, steady: the highest of a few seconds' samples);
2. the same agent while it trains the coordinator's rounds, each in three child processes one
   after the other (``edge_agent.round_data`` prepares the data and the anchors' forecasts, then
   ``edge_agent.training_child`` exports the verified ONNX serving bundle of the accepted global
   model, then another one trains); the campaign's last global model is exported too: the
   peak resident memory of each kind of child (their own ``VmHWM``, as the agent logs it), the
   agent's own highest VmRSS meanwhile, and CPU seconds (user + system, children included) per
   round, from the announcement of round 1 to the agent's exit;
3. ``edgefl agent serve``, the torch-free serving process, publishing a forecast every second
   from that bundle: resident memory (VmRSS, steady), optionally run by another interpreter
   (``--serve-python``: a virtualenv holding only ``pip install 'edgefl[serve]'``; repeated, one
   measurement per interpreter, keyed by its Python version).

Then the forecast latency of the served model at batch 1 on one thread, torch eager against
ONNX Runtime, after a warm-up; with ``--install-mb``, the size of a fresh virtualenv's
site-packages per extra (pip and setuptools left out). The Python versions the gateway's tests
pass on (``make python-versions``) and the linux/aarch64 forecast (``make arm-check``) are not
measured here: they are copied from their committed results files, each with the commit and
command that produced it.

    python bench/gateway.py             # 3 rounds, 1000 timed forecasts
    python bench/gateway.py --quick     # 2 rounds, 200 timed forecasts
    python bench/gateway.py --serve-python /tmp/serve/bin/python --install-mb serve,gateway
    python bench/gateway.py --serve-python .venv/bin/python --serve-python /tmp/serve-3.12/bin/python \
        --serve-python /tmp/serve-3.13/bin/python   # agent serve on three Python versions
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from common import ROOT, bench_parser, configure, run_config
from tests.broker import Mosquitto
from tests.fleet import wait_for

SITE, FEATURES, ROWS = "amsterdam", ("temp_air", "relative_humidity", "wind_speed"), 700  # 29 days < retention
STATION, FORECASTS = "zigbee2mqtt/amsterdam", "home/amsterdam/forecast"
QUICK = {"rounds": 2, "calls": 200, "warmup": 50}
FULL = {"rounds": 3, "calls": 1000, "warmup": 100}
GOALS = {"idle_rss_mb": 100, "serving_rss_mb": 85, "training_rss_mb": 350, "ort_speedup": 3,
         "install_mb_serve": 200}  # issues 28 and 45 (item 7)
CHILD_PEAK = re.compile(r"training process peak (\d+) MB, data process peak (\d+) MB")
FACTS_PEAK = re.compile(r"model facts process peak (\d+) MB")
EXPORT_PEAK = re.compile(r"export process peak (\d+) MB")
VENV_TOOLS = ("pip", "setuptools", "_distutils_hack", "distutils-precedence.pth")
SAMPLE_S = 0.05
BLOCK = 50  # forecasts timed in a row before the other runtime's turn


def vm_rss(pid: int) -> float:
    """Resident memory of a running process in MB (``/proc/<pid>/status``; psutil is not a dependency)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_parts(pid: int) -> dict[str, float]:
    """A process's resident memory split in two (MB, ``/proc/<pid>/smaps_rollup``): ``anonymous``,
    what it allocated itself (heap, arenas, stacks), and ``file``, the pages of the files it maps
    (its libraries' code and read-only data: shared with every process that maps them, and given
    back to the kernel under pressure without swap)."""
    fields = {line.split(":")[0]: int(line.split()[1]) for line in
              Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]}
    return {"anonymous": fields["Anonymous"] / 1024, "file": (fields["Rss"] - fields["Anonymous"]) / 1024}


def steady_rss(pid: int, seconds: float) -> float:
    """The highest VmRSS over ``seconds`` of samples (MB)."""
    deadline, highest = time.monotonic() + seconds, 0.0
    while time.monotonic() < deadline:
        highest = max(highest, vm_rss(pid))
        time.sleep(SAMPLE_S)
    return highest


def edgefl(work: Path, name: str, *args: str, python: str = sys.executable) -> subprocess.Popen:
    """An ``edgefl`` command in the background on one torch thread, its output in ``<name>.log``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with open(work / f"{name}.log", "w") as log:
        return subprocess.Popen([python, "-m", "edgefl.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=ROOT)


def reap(process: subprocess.Popen, timeout: float, watched: int | None = None) -> tuple[float, float]:
    """Wait for ``process`` to exit; the highest VmRSS of another process ``watched`` meanwhile (MB,
    sampled) and the CPU seconds of ``process``, its children's included (rusage)."""
    deadline, highest = time.monotonic() + timeout, 0.0
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return highest, usage.ru_utime + usage.ru_stime
        highest = highest if watched is None else max(highest, vm_rss(watched))
        time.sleep(SAMPLE_S)
    raise TimeoutError(f"{process.args} did not exit in {timeout:g} s")


def write_configs(work: Path, port: int, rounds: int) -> tuple[Path, Path]:
    """``agent.toml`` (a live gateway with the default head-mode model) and ``coordinator.toml``."""
    from edge_agent.config import dump_toml

    features = [{"name": f, "topic": STATION, "path": f, "time_path": "last_seen"} for f in FEATURES]
    agent = {"fleet": "bench", "client_id": "gateway", "state_dir": str(work / "agent"), "broker": {"port": port},
             "data": {"source": "sensors", "gaps": {"fill": "ffill", "max_fill_steps": 2}},
             "sensors": {"step": "1h", "broker": {"port": port}, "features": features},
             "serving": {"topic": FORECASTS, "every_s": 1.0, "stale_after": "2d"}}  # replayed: up to a day old
    coordinator = {"fleet": "bench", "state_dir": str(work / "coordinator"), "rounds": rounds, "min_clients": 1,
                   "start_clients": 1, "linger_s": 0, "broker": {"port": port}}
    paths = work / "agent.toml", work / "coordinator.toml"
    for path, data in zip(paths, (agent, coordinator)):
        path.write_text(dump_toml(data))
    return paths


def replay(port: int) -> None:
    """``edgefl replay`` of the station's latest ``ROWS`` hours as zigbee2mqtt readings, rebased to now."""
    done = subprocess.run([sys.executable, "-m", "edgefl.cli", "replay", "--site", SITE, "--rows", str(ROWS),
                           "--columns", ",".join(FEATURES), "--style", "zigbee2mqtt", "--speedup", "0",
                           "--port", str(port)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(done.stdout + done.stderr)


def agent_footprint(work: Path, port: int, agent_toml: Path, coordinator_toml: Path, rounds: int) -> dict:
    """Idle and training memory and CPU per round of ``edgefl agent run``."""
    hello, sensors = Watch(port, "edgefl/bench/agents/gateway/hello"), Watch(port, "edgefl/gateway-sensors/status")
    try:
        agent = edgefl(work, "agent", "agent", "run", "-c", str(agent_toml))
        wait_for(sensors.seen.is_set, 120, "the agent's sensor client")
        replay(port)
        wait_for(hello.seen.is_set, 120, "the agent's registration (its model built on the history)")
    finally:
        hello.close()
        sensors.close()
    idle = steady_rss(agent.pid, 5.0)
    before = cpu_seconds(agent.pid)
    coordinator = edgefl(work, "coordinator", "coordinator", "serve", "-c", str(coordinator_toml))
    agent_peak, _ = reap(coordinator, 600, agent.pid)
    log = work / "agent.log"
    wait_for(lambda: "waiting for the next campaign" in log.read_text(), 120, "the agent's last round")
    wait_for(lambda: len(EXPORT_PEAK.findall(log.read_text())) > rounds, 300,
             "the export of the campaign's last global model")
    agent.send_signal(signal.SIGTERM)  # a live gateway that serves goes on after the campaign: stop it
    _, cpu = reap(agent, 60)
    if agent.returncode or coordinator.returncode:
        raise RuntimeError(f"agent exit {agent.returncode}, coordinator exit {coordinator.returncode}; see {work}")
    children = [(float(train), float(data)) for train, data in CHILD_PEAK.findall(log.read_text())]
    if len(children) != rounds:
        raise RuntimeError(f"{len(children)} training children reported their peak, {rounds} rounds ran; see {work}")
    facts, exports = (list(map(float, pattern.findall(log.read_text()))) for pattern in (FACTS_PEAK, EXPORT_PEAK))
    return {"agent_idle": idle, "training_child": max(train for train, _ in children),
            "round_data": max(data for _, data in children), "model_facts": max(facts), "export": max(exports),
            "agent_while_training": agent_peak, "round_cpu_s": (cpu - before) / rounds}


class Watch:
    """Whether anything (retained included) arrived on ``topic``."""

    def __init__(self, port: int, topic: str):
        from edge_agent.mqtt import paho_client

        self.seen = threading.Event()
        self.client = paho_client()
        self.client.on_connect = lambda client, *_: client.subscribe(topic, qos=1)
        self.client.on_message = lambda *_: self.seen.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def serving_footprint(work: Path, agent_toml: Path, python: str) -> dict:
    """Steady memory of ``edgefl agent serve`` run by ``python``, publishing a forecast every second."""
    name = f"serve-{python_version(python)}"
    server = edgefl(work, name, "agent", "serve", "-c", str(agent_toml), python=python)
    log = work / f"{name}.log"
    wait_for(lambda: "(loaded: " in log.read_text(), 120, "the serving process's bundle")
    time.sleep(2.0)  # a couple of forecasts out
    rss, parts = steady_rss(server.pid, 5.0), memory_parts(server.pid)
    server.send_signal(signal.SIGTERM)
    server.wait(60)
    loaded = next(line for line in log.read_text().splitlines() if "(loaded: " in line)
    return {"rss": rss, "parts": parts, "loaded": loaded.rpartition("(loaded: ")[2].rstrip(")"), "python": python}


def python_version(python: str) -> str:
    """``3.13`` for an interpreter of Python 3.13."""
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], check=True,
                          capture_output=True, text=True).stdout.strip()


def latency(agent_toml: Path, calls: int, warmup: int) -> dict:
    """Milliseconds per forecast at batch 1 on one thread: the served torch model in eager mode
    against its ONNX bundle in ONNX Runtime, on the same latest window."""
    import torch

    from edge_agent.config import AgentConfig, load_config
    from edge_agent.data import prepare_client
    from edge_agent.forecast import load_local_model
    from edge_agent.live import gateway_table
    from edge_agent.serving.onnx_serving import OnnxServing

    torch.set_num_threads(1)
    cfg = load_config(agent_toml, AgentConfig)
    table = gateway_table(cfg)
    model = load_local_model(cfg, table).eval()
    test = prepare_client(table, model.cfg.lookback, model.cfg.horizon).test
    x, marks, _ = test.batch(torch.tensor([len(test) - 1]))
    x, marks = x.float(), marks.float()
    session = OnnxServing(cfg.state_dir / "serving").session
    inputs = {"x": x.numpy(), "marks": marks.numpy()}
    with torch.inference_mode():
        ms = timed({"torch": lambda: model(x, marks), "ort": lambda: session.run(["forecast"], inputs)}, calls, warmup)
    return {f"{name}_p{q}": pct(times, q) for name, times in ms.items() for q in (50, 99)}


def install_mb(extra: str, folder: Path) -> float:
    """MB of a fresh virtualenv's site-packages after ``pip install '<this checkout>[extra]'``
    (the virtualenv's own pip and setuptools left out)."""
    venv = folder / f"venv-{extra}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    f"{ROOT}[{extra}]"], check=True, timeout=1800, capture_output=True)
    site = next(venv.glob("lib/python*/site-packages"))
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink()
               and not any(f.relative_to(site).parts[0].startswith(tool) for tool in VENV_TOOLS))
    shutil.rmtree(venv)
    return round(size / 2**20, 1)


def default_model() -> str:
    """The model the agent trains: the recipe's, as ``edge_agent.recipe`` holds it at this commit."""
    from edge_agent.recipe import MODEL

    return "default head mode (" + ", ".join(f"{key} {value}" for key, value in MODEL.items()) + ")"


def committed_results() -> dict:
    """The Python versions the gateway's tests passed on and the linux/aarch64 forecast, from their
    committed results files (not measured by this script), each with the commit and command that
    produced it."""
    versions = json.loads((ROOT / "bench" / "results" / "python_versions.json").read_text())
    arm = json.loads((ROOT / "bench" / "results" / "arm_check.json").read_text())
    return {"python_versions": {"from": "bench/results/python_versions.json", "commit": versions["commit"],
                                "command": versions["command"], "tests": versions["tests"],
                                "versions": {version: {"python": run["python"], "passed": len(run["passed"]),
                                                       "failed": len(run["failed"]), "skipped": len(run["skipped"])}
                                             for version, run in versions["python_versions"].items()}},
            "aarch64": {"forecast": arm["forecast"], "seconds": arm["seconds"], "python": arm["python"],
                        "from": "bench/results/arm_check.json", "commit": arm["commit"], "command": arm["command"]}}


def timed(runs: dict[str, Callable[[], object]], calls: int, warmup: int) -> dict[str, np.ndarray]:
    """Milliseconds of each of ``calls`` calls of every run after ``warmup`` untimed ones, the runs
    taking turns in blocks of ``BLOCK`` calls, so that a shared machine's changing load falls on
    all of them alike."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for first in range(0, calls, BLOCK):
        for name, run in runs.items():
            for _ in range(min(BLOCK, calls - first)):
                started = time.perf_counter()
                run()
                times[name].append((time.perf_counter() - started) * 1e3)
    return {name: np.array(values) for name, values in times.items()}


def pct(values: np.ndarray, q: float) -> float:
    """The ``q``-th percentile, rounded for the results file."""
    return round(float(np.percentile(values, q)), 4)


def table(summary: dict) -> str:
    """The results as a markdown table, with the goals of issue 28."""
    rss, ms = summary["rss_mb"], summary["forecast_ms"]
    lines = ["| measure | value | goal |", "| --- | --- | --- |",
             f"| RSS idle agent | {rss['agent_idle']:.0f} MB | <= {GOALS['idle_rss_mb']} MB |",
             f"| RSS training child (peak) | {rss['training_child']:.0f} MB | <= {GOALS['training_rss_mb']} MB |",
             f"| RSS data child before it (peak) | {rss['round_data']:.0f} MB | <= {GOALS['training_rss_mb']} MB |",
             f"| RSS model facts child (peak) | {rss['model_facts']:.0f} MB | <= {GOALS['training_rss_mb']} MB |",
             f"| RSS export child (peak) | {rss['export']:.0f} MB | <= {GOALS['training_rss_mb']} MB |",
             f"| RSS agent while its child trains (peak) | {rss['agent_while_training']:.0f} MB | |",
             *(f"| RSS serving-only (`agent serve`), Python {version} | {mb:.0f} MB "
               f"({rss['serving_parts'][version]['anonymous']:.0f} anonymous, {rss['serving_parts'][version]['file']:.0f} "
               f"from files) | <= {GOALS['serving_rss_mb']} MB |" for version, mb in rss["serving"].items()),
             f"| CPU per round (train + ONNX export) | {summary['round_cpu_s']:.2f} s | |",
             f"| forecast torch eager p50 / p99 | {ms['torch_p50']:.3f} / {ms['torch_p99']:.3f} ms | |",
             f"| forecast ONNX Runtime p50 / p99 | {ms['ort_p50']:.3f} / {ms['ort_p99']:.3f} ms | |",
             f"| ORT speedup (p50) | {ms['ort_speedup']:.1f}x | >= {GOALS['ort_speedup']}x |"]
    lines += [f"| install `edgefl[{extra}]` | {mb:.0f} MB | {'<= 200 MB' if extra == 'serve' else ''} |"
              for extra, mb in summary.get("install_mb", {}).items()]
    versions, arm = summary["python_versions"], summary["aarch64"]
    passed = ", ".join(f"{v}: {run['passed']} passed, {run['failed']} failed" for v, run in versions["versions"].items())
    lines += [f"| Python versions (`{versions['command']}` at {versions['commit'][:7]}) | {passed} | 3.11-3.13 |",
              f"| linux/aarch64 forecast (`{arm['command']}` at {arm['commit'][:7]}) | {arm['forecast']}, "
              f"{arm['seconds']} s | true |"]
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, "2 rounds and 200 timed forecasts")
    parser.add_argument("--serve-python", action="append", default=None,
                        help="interpreter of `agent serve` (e.g. a virtualenv with only edgefl[serve]); repeat it "
                        "to measure several Python versions (default: this one)")
    parser.add_argument("--install-mb", default="", help="comma-separated extras whose install size to measure "
                        "(a fresh virtualenv each: minutes)")
    args, cfg, started = configure(parser, QUICK, FULL)
    with tempfile.TemporaryDirectory(prefix="edgefl-gateway-") as folder:
        work = Path(folder)
        broker = Mosquitto(work / "broker").start()
        try:
            agent_toml, coordinator_toml = write_configs(work, broker.port, cfg["rounds"])
            agent = agent_footprint(work, broker.port, agent_toml, coordinator_toml, cfg["rounds"])
            serving = {python_version(python): serving_footprint(work, agent_toml, python)
                       for python in args.serve_python or [sys.executable]}
            forecast_ms = latency(agent_toml, cfg["calls"], cfg["warmup"])
        finally:
            broker.stop()
        sizes = {extra: install_mb(extra, work) for extra in filter(None, args.install_mb.split(","))}
    forecast_ms["ort_speedup"] = round(forecast_ms["torch_p50"] / forecast_ms["ort_p50"], 1)
    summary = {"rss_mb": {k: round(agent[k], 1) for k in ("agent_idle", "training_child", "round_data", "model_facts", "export",
                                                           "agent_while_training")}
               | {"serving": {version: round(run["rss"], 1) for version, run in serving.items()},
                  "serving_parts": {version: {part: round(mb, 1) for part, mb in run["parts"].items()}
                                    for version, run in serving.items()}},
               "round_cpu_s": round(agent["round_cpu_s"], 2), "forecast_ms": forecast_ms,
               **({"install_mb": sizes} if sizes else {}), **committed_results(),
               "config": {**run_config(cfg, args.quick, started), "site": SITE, "features": list(FEATURES),
                          "rows": ROWS, "model": default_model(),
                          "serving_loaded": {version: run["loaded"] for version, run in serving.items()},
                          "serving_python": {version: run["python"] for version, run in serving.items()}, "goals": GOALS,
                          "rss": "agent_idle and serving: steady VmRSS over 5 s; training_child and round_data: the highest "
                                 "VmHWM of the training children and of the data children that run before them (one "
                                 "each per round, never at once); model_facts: of the children the agent learns its "
                                 "model's facts from; export: of the children exporting each accepted global model's "
                                 "bundle (between the data and the training child, and one for the campaign's last); "
                                 "agent_while_training: the agent's own VmRSS, "
                                 "sampled every 50 ms; serving by Python version (major.minor) of the serving interpreter; "
                                 "serving_parts: the serving process's resident memory after those 5 s, allocated by "
                                 "itself and mapped from files (smaps_rollup)"}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gateway.json").write_text(json.dumps(summary, indent=2))
    print(table(summary))
    print(f"wrote {args.out / 'gateway.json'} in {summary['config']['wall_seconds']} s")


if __name__ == "__main__":
    main()
