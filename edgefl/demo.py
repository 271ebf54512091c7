"""``edgefl demo``: a real fleet on this machine. mosquitto with generated credentials and ACL,
the coordinator (with its dashboard) and one agent process per bundled weather site; each start-up
stage and closed round is reported as it happens (``edgefl.demo_plots`` draws the pictures)."""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port, write_fleet_setup
from coordinator.store import RoundRow as StoredRound, Store
from edge_agent.candidates import quality, validation_scores
from edge_agent.config import dump_toml
from edge_agent.data import list_sites
from edgefl.init_fleet import edgefl_command

DEMO_MODEL = {"backbone": "dlinear"}  # the recipe: ModelConfig's defaults
QUIET_S = 10.0  # the longest the demo stays silent while rounds run
DEMO_TRAINING = {"local_epochs": 1, "stride": 13}  # the recipe's batches, keep_local and anchors (AgentTraining)
# Seven agents share this machine's cores, as agents on gateways never do: one math thread each, so
# their training processes do not oversubscribe the cores (torch and BLAS spin-wait on idle threads).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
FEDERATED = "federated"  # the candidate that is the fleet's model (``edge_agent.selection``)


@dataclass(frozen=True)
class RoundRow:
    """One closed round: who took part, the sample-weighted training loss, and the fleet's mean
    validation MASE of the federated model each agent started the round from and of the
    candidate it served then (NaN where no agent reported one)."""

    round: int
    clients: int
    accepted: int
    rejected: int
    loss: float
    val_federated: float
    val_served: float
    seconds: float


@dataclass(frozen=True)
class DemoFleet:
    """Where a demo's pieces are: its folder, every service's config (by file name), its sites
    and the coordinator's dashboard."""

    folder: Path
    configs: dict[str, Path]
    sites: list[str]
    broker_port: int
    dashboard: str

    @property
    def coordinator_config(self) -> Path:
        return self.configs["coordinator.toml"]

    @property
    def coordinator_state(self) -> Path:
        return self.folder / "state" / "coordinator"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    def agent_config(self, site: str) -> Path:
        return self.configs[f"{site}.toml"]


def configure(workdir: Path, rounds: int, stations: int | None = None) -> DemoFleet:
    """Generate the broker setup for the first ``stations`` bundled sites (None: all), then give
    every service the demo's model and schedule, and the coordinator a dashboard on a free
    loopback port."""
    sites, port, http_port = list_sites()[:stations], free_port(), free_port()
    written = write_fleet_setup("demo", sites, workdir / "broker", port=port, state_root=workdir / "state")
    for name, path in written.items():
        if not name.endswith(".toml"):
            continue
        config = tomllib.loads(path.read_text())
        config["model"] = DEMO_MODEL
        if name == "coordinator.toml":
            config.update(rounds=rounds, min_clients=len(sites), round_timeout_s=120.0,
                          http={"host": "127.0.0.1", "port": http_port})
        else:
            config["training"] = DEMO_TRAINING
        path.write_text(dump_toml(config))
    return DemoFleet(workdir, written, sites, port, f"http://127.0.0.1:{http_port}/")


def run_demo(fleet: DemoFleet, rounds: int, on_stage: Callable[[str], None],
             on_round: Callable[[RoundRow], None]) -> list[RoundRow]:
    """Start everything, report each start-up stage and closed round, stop everything; returns the round rows."""
    broker = start_mosquitto(fleet.configs["mosquitto.conf"], fleet.folder / "broker")
    processes: list[subprocess.Popen] = []
    try:
        wait_for_port(fleet.broker_port, broker)
        on_stage(f"broker up on 127.0.0.1:{fleet.broker_port}")
        fleet.logs.mkdir(exist_ok=True)
        processes.append(_spawn(fleet.logs / "coordinator.log", "coordinator", "serve", "-c", fleet.coordinator_config))
        for site in fleet.sites:
            processes.append(_spawn(fleet.logs / f"{site}.log", "agent", "run", "-c", fleet.agent_config(site),
                                    env=ONE_THREAD))
        return _watch(fleet, rounds, processes[0], on_stage, on_round)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(30)
        broker.terminate()
        broker.wait(10)


def _spawn(log: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.Popen:
    """One ``edgefl`` service process, its output into ``log``, with ``env`` added to this one's."""
    return subprocess.Popen([sys.executable, "-m", "edgefl.cli", *map(str, args)], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


class _StartUp:
    """Says once that the coordinator is up, and how many agents have registered whenever that changes."""

    def __init__(self, fleet: DemoFleet, on_stage: Callable[[str], None]):
        self.fleet, self.on_stage, self.up, self.registered = fleet, on_stage, False, 0

    def check(self, store: Store) -> None:
        """Report what changed in ``store`` since the last poll."""
        if not self.up and store.latest_round() is not None:
            self.up = True
            self.on_stage(f"coordinator up: campaign {store.campaign()}, dashboard on {self.fleet.dashboard}")
        registered = store.client_count()
        if registered != self.registered:
            self.registered = registered
            self.on_stage(f"{registered}/{len(self.fleet.sites)} agents registered")


def _watch(fleet: DemoFleet, rounds: int, coordinator: subprocess.Popen,
           on_stage: Callable[[str], None], on_round: Callable[[RoundRow], None]) -> list[RoundRow]:
    """Poll the coordinator's store and report start-up and every round as it closes, and at
    least every ``QUIET_S`` seconds how far the open round is."""
    reported: list[RoundRow] = []
    started, said = time.time(), time.monotonic()

    def stage(line: str) -> None:
        nonlocal said
        said = time.monotonic()
        on_stage(line)

    start_up = _StartUp(fleet, stage)
    while len(reported) < rounds:
        if coordinator.poll() not in (None, 0):
            raise RuntimeError(f"the coordinator exited with status {coordinator.returncode}; see its log")
        if (fleet.coordinator_state / "coordinator.sqlite3").exists():
            store = Store(fleet.coordinator_state)
            start_up.check(store)
            for row in store.rounds():
                if row.closed_at and row.round > len(reported):
                    reported.append(_round_row(store, row, started))
                    on_round(reported[-1])
                    said = time.monotonic()
            if time.monotonic() - said >= QUIET_S and (open_round := store.latest_round()) is not None:
                why = "; each station fits its anchors first" if open_round.round == 1 else ""
                stage(f"round {open_round.round}: {len(store.updates(open_round.round))} of {store.client_count()} "
                      f"stations' updates in ({time.time() - started:.0f} s{why})")
            store.close()
        time.sleep(0.5)
    coordinator.wait(60)
    return reported


def _round_row(store: Store, row: StoredRound, started: float) -> RoundRow:
    """A closed round's row from the coordinator's store: its round metrics, its refusals and the
    validation scores the agents sent with their updates (``edge_agent.candidates``)."""
    metrics = [update.metrics for update in store.updates(row.round)]
    rejected = sum(1 for e in store.events(accepted=False) if e["round"] == row.round)
    federated = [validation_scores(m).get(FEDERATED, math.nan) for m in metrics]
    served = [served_score(m) for m in metrics]
    return RoundRow(row.round, store.client_count(), len(row.metrics["clients"]), rejected, row.metrics["loss"],
                    _mean(federated), _mean(served), row.closed_at - started)


def served_score(metrics: dict[str, float]) -> float:
    """The validation score of what a gateway says it serves (``quality``), the federated model's
    where it says nothing, NaN where it reports neither."""
    row = quality(metrics)
    served = None if row is None else row["served"] if row["serves"] else row["federated"]
    return math.nan if served is None else served


def _mean(values: list[float]) -> float:
    """The mean of the finite ``values``; NaN where there is none."""
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def round_table(stations: int) -> Table:
    """The demo's table of closed rounds (``round_cells`` fills a row)."""
    return Table("round", "clients", "accepted", "rejected", "train loss", "val MASE federated", "val MASE served",
                 "elapsed s", title=f"edgefl fleet: {stations} weather stations over MQTT",
                 caption="val MASE: mean over the stations, of the models each round started from")


def round_cells(row: RoundRow) -> list[str]:
    """A closed round as table cells ("-" where no station reported a validation score)."""
    scores = [f"{v:.4f}" if math.isfinite(v) else "-" for v in (row.loss, row.val_federated, row.val_served)]
    return [str(row.round), str(row.clients), str(row.accepted), str(row.rejected), *scores, f"{row.seconds:.1f}"]


def look_next(fleet: DemoFleet, curve: Path, forecasts: Path) -> list[str]:
    """Where a person looks after the demo: its pictures, the commands that read its state, its logs."""
    return [
        "look next:",
        f"  training loss and validation MASE per round: {curve}",
        f"  each station's last test days, measured and forecast: {forecasts}",
        "  rounds, clients and what each station serves: "
        + shlex.join([*edgefl_command(), "coordinator", "status", "-c", str(fleet.coordinator_config)]),
        "  a station's forecast of its next day: "
        + shlex.join([*edgefl_command(), "agent", "forecast", "-c", str(fleet.agent_config(fleet.sites[0]))]),
        f"  logs of the coordinator and of every station: {fleet.logs}",
        f"  dashboard: {fleet.dashboard} was live while the rounds ran (it stops with the coordinator)",
    ]
