"""``edgefl demo``: a real fleet on this machine. mosquitto with generated credentials and ACL,
the coordinator and one agent process per bundled weather site, a live table, a PNG curve."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port, write_fleet_setup
from coordinator.store import Store
from edge_agent.config import dump_toml
from edge_agent.data import list_sites

DEMO_MODEL = {"backbone": "dlinear"}  # the recipe: ModelConfig's defaults
DEMO_TRAINING = {"local_epochs": 1, "stride": 13}  # the recipe's batches, keep_local and anchors (AgentTraining)


@dataclass(frozen=True)
class RoundRow:
    round: int
    clients: int
    accepted: int
    rejected: int
    loss: float
    seconds: float


def _configure(workdir: Path, rounds: int, port: int) -> tuple[dict[str, Path], list[str]]:
    """Generate the broker setup, then give every service the demo's model and schedule."""
    sites = list_sites()
    written = write_fleet_setup("demo", sites, workdir / "broker", port=port, state_root=workdir / "state")
    for name, path in written.items():
        if not name.endswith(".toml"):
            continue
        config = tomllib.loads(path.read_text())
        config["model"] = DEMO_MODEL
        if name == "coordinator.toml":
            config.update(rounds=rounds, min_clients=len(sites), round_timeout_s=120.0)
        else:
            config["training"] = DEMO_TRAINING
        path.write_text(dump_toml(config))
    return written, sites


def run_demo(workdir: Path, rounds: int, on_round: Callable[[RoundRow], None]) -> list[RoundRow]:
    """Start everything, report each closed round, stop everything; returns the round rows."""
    port = free_port()
    written, sites = _configure(workdir, rounds, port)
    broker = start_mosquitto(written["mosquitto.conf"], workdir / "broker")
    processes: list[subprocess.Popen] = []
    try:
        wait_for_port(port, broker)
        logs = workdir / "logs"
        logs.mkdir(exist_ok=True)
        processes.append(_spawn(logs / "coordinator.log", "coordinator", "serve", "-c", written["coordinator.toml"]))
        for site in sites:
            processes.append(_spawn(logs / f"{site}.log", "agent", "run", "-c", written[f"{site}.toml"]))
        return _watch(workdir / "state" / "coordinator", rounds, processes[0], on_round)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        broker.terminate()
        broker.wait(10)


def _spawn(log: Path, *args: object) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "edgefl.cli", *map(str, args)], stdout=open(log, "w"), stderr=subprocess.STDOUT
    )


def _watch(state: Path, rounds: int, coordinator: subprocess.Popen, on_round) -> list[RoundRow]:
    """Poll the coordinator's store and report every round as it closes."""
    reported: list[RoundRow] = []
    started = time.time()
    while len(reported) < rounds:
        if coordinator.poll() not in (None, 0):
            raise RuntimeError(f"the coordinator exited with status {coordinator.returncode}; see its log")
        if (state / "coordinator.sqlite3").exists():
            store = Store(state)
            for row in store.rounds():
                if row.closed_at and row.round > len(reported):
                    rejected = sum(1 for e in store.events(accepted=False) if e["round"] == row.round)
                    item = RoundRow(row.round, len(store.clients()), len(row.metrics["clients"]), rejected,
                                    row.metrics["loss"], row.closed_at - started)
                    reported.append(item)
                    on_round(item)
            store.close()
        time.sleep(0.5)
    coordinator.wait(60)
    return reported


def plot_curve(rows: list[RoundRow], path: Path) -> None:
    """Training loss (sample-weighted over the agents' updates) per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([r.round for r in rows], [r.loss for r in rows], marker="o")
    ax.set(xlabel="round", ylabel="training loss (MSE, normalized)", title="edgefl demo: 7 weather stations")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
