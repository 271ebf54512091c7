"""Helpers that set up a real fleet for service tests: data files, configs, processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

from edge_agent.config import dump_toml
from edge_agent.data import allocate_features, build_pool, client_tables, load_csv, load_sites, prepare_client

MODEL = {"backbone": "dlinear", "lookback": 24, "horizon": 12, "d_qap": 16, "qap_heads": 2}
TRAINING = {"local_epochs": 1, "batch_size": 64, "lr": 0.003, "stride": 16, "keep_local": False,
            "anchors": [], "min_steps": 0}  # the transport under test; test_service checks the serving choice
SEED = 7


def write_client_csvs(folder: Path, n_clients: int) -> list[Path]:
    """Feature-level non-IID clients of the real weather pool, one CSV each (exact float32 text)."""
    pool = build_pool(load_sites())
    tables = client_tables(pool, allocate_features(pool.n_features, n_clients, 4, SEED))
    paths = []
    for table in tables:
        frame = pd.DataFrame(table.values, columns=[c.replace("/", "_") for c in table.columns])
        frame.insert(0, "date", table.index.strftime("%Y-%m-%d %H:%M:%S"))
        path = folder / f"{table.name}.csv"
        frame.to_csv(path, index=False, float_format="%.9g")
        paths.append(path)
    return paths


def simulation_clients(paths: list[Path]):
    """The same clients, read back the way an agent reads them."""
    return [
        prepare_client(load_csv(p), MODEL["lookback"], MODEL["horizon"], TRAINING["stride"]) for p in paths
    ]


def coordinator_config(
    folder: Path, port: int, rounds: int, broker: dict | None = None, fleet_model: dict | None = None,
    **overrides: object,
) -> Path:
    """``coordinator.toml`` of a test fleet; ``fleet_model``: the mode's fields (default: head mode's MODEL)."""
    data = {
        "fleet": "test", "state_dir": str(folder / "coordinator"), "rounds": rounds, "min_clients": 1,
        "round_timeout_s": 60.0, "seed": SEED, **overrides,
        **(fleet_model or {"model": MODEL}), "broker": {"port": port, **(broker or {})},
    }
    path = folder / "coordinator.toml"
    path.write_text(dump_toml(data))
    return path


def agent_config(folder: Path, port: int, index: int, csv: Path, training: dict | None = None,
                 model: dict | None = None, extra: dict | None = None, **broker: object) -> Path:
    """``agent.toml`` of a test gateway; ``extra``: more top-level fields, ``broker``: the [broker] table's."""
    data = {**(extra or {}),
        "fleet": "test", "client_id": f"client{index:02d}", "state_dir": str(folder / f"agent{index}"),
        "seed": SEED, "client_index": index, "data": {"csv": str(csv)}, "model": model or MODEL,
        "training": {**TRAINING, **(training or {})}, "broker": {"port": port, "keepalive_s": 5, **broker},
    }
    path = folder / f"agent{index}.toml"
    path.write_text(dump_toml(data))
    return path


STARTED: list[subprocess.Popen] = []  # every process a test started, killed after it (see conftest)


def edgefl_without(modules: tuple[str, ...]) -> list[str]:
    """The Python arguments that run the ``edgefl`` CLI as on an install without ``modules`` (an
    import finder that raises ModuleNotFoundError for them, as a missing package does)."""
    if not modules:
        return ["-m", "edgefl.cli"]
    return ["-c", "import runpy, sys\n"
            "class Missing:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            f"        if name.partition('.')[0] in {sorted(modules)!r}:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Missing())\n"
            "runpy.run_module('edgefl.cli', run_name='__main__', alter_sys=True)\n"]


def edgefl_reporting(modules: tuple[str, ...], report: Path) -> list[str]:
    """The Python arguments that run the ``edgefl`` CLI and, as it exits, write to ``report`` which of
    ``modules`` it had loaded (space-separated; empty: none)."""
    return ["-c", "import atexit, runpy, sys\n"
            f"atexit.register(lambda: open({str(report)!r}, 'w').write("
            f"' '.join(m for m in {modules!r} if m in sys.modules)))\n"
            "runpy.run_module('edgefl.cli', run_name='__main__', alter_sys=True)\n"]


class Logged(subprocess.Popen):
    """A process ``start`` ran, with its log: a wait tells a slow process from a stuck one."""

    log: Path


def start(folder: Path, name: str, *args: str, missing: tuple[str, ...] = (), reported: tuple[str, ...] = ()
          ) -> Logged:
    """Run an ``edgefl`` command in the background, its output in ``<name>.log``, with as many
    torch threads as this process (float sums depend on it; the in-process replays must match);
    ``missing``: modules it runs without (``edgefl_without``); ``reported``: modules it says in
    ``<name>.modules`` it had loaded when it exits (``edgefl_reporting``)."""
    log = open(folder / f"{name}.log", "w")
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    python = edgefl_reporting(reported, folder / f"{name}.modules") if reported else edgefl_without(missing)
    process = Logged([sys.executable, *python, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
    process.log = folder / f"{name}.log"
    STARTED.append(process)
    return process


def exits(processes: list[subprocess.Popen], quiet_s: float = 120, limit_s: float = 1800) -> None:
    """Wait until every process has exited. The deadline comes from events, not the clock: it moves
    on whenever one of their logs grows, so a slow, loaded machine is waited for while a fleet that
    stays silent for ``quiet_s`` (or runs past ``limit_s``) fails, naming the silent logs."""
    logs = [p.log for p in processes if isinstance(p, Logged)]
    started, last, seen = time.monotonic(), time.monotonic(), log_sizes(logs)
    while any(p.poll() is None for p in processes):
        now = time.monotonic()
        if (current := log_sizes(logs)) != seen:
            last, seen = now, current
        if now - last > quiet_s or now - started > limit_s:
            running = [str(getattr(p, "log", p.args)) for p in processes if p.poll() is None]
            raise TimeoutError(f"still running after {now - started:.0f} s, silent for {now - last:.0f} s: {running}")
        time.sleep(0.2)


def log_sizes(logs: list[Path]) -> list[int]:
    return [log.stat().st_size if log.exists() else 0 for log in logs]


def exit_code(process: subprocess.Popen, quiet_s: float = 120) -> int:
    """``process``'s exit status, waited for as :func:`exits` does."""
    exits([process], quiet_s)
    return process.returncode


def stop_started() -> None:
    """Kill whatever a test left running (a failed test must not leave a coordinator behind)."""
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(30)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")
