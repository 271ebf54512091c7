"""Fault bench: a small real fleet through network faults made on this machine (issue 12, item 7).

Each fault gets a fleet of its own: mosquitto (persistence on) and the coordinator in the root
namespace on 127.0.0.1, and 3 agents (the tiny dlinear and bundled-station CSVs of
``tests/fleet.py``), each in a network namespace made for the run, reaching the broker over a
veth pair through a relay in the root namespace. The faults, applied once round 2 is open:

- ``latency_300ms``: every agent's traffic is held back 300 ms each way (by its relay);
- ``loss_10pct``: 10% of every agent's packets are dropped each way (netfilter's ``statistic``
  match on the agent's side of its veth);
- ``partition_30s``: one gateway drops everything for 30 s, then heals;
- ``broker_restart``: mosquitto is stopped (SIGTERM: it writes its persistence) and restarted.

Why not ``tc netem``: this machine's kernel is built without ``sch_netem`` (and loads no modules),
so ``tc qdisc ... netem`` fails with "Specified qdisc kind is unknown". The netfilter drop is the
same packet loss netem makes; the relay adds latency to the TCP stream rather than to packets.

Per fault: ``rounds_completed`` (rounds closed from the fault's start until its end, healed) and
``updates_lost``: updates an agent recorded as sent (its own event log) that are not in the
coordinator's store, unless the coordinator refused them with a code; acknowledged-but-missing
updates are counted there too and also listed apart. Every wait is for an event (the store or
the agents' event logs) with a deadline, except the 30 s of the partition. The coordinator runs
an open-ended number of rounds; at the end the agents are stopped first, then the coordinator
once it has stored everything the agents sent (or a deadline passed).

    python bench/faults.py --quick          # needs root, iptables and mosquitto
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common import ROOT

from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port
from coordinator.store import Store
from tests.fleet import agent_config, coordinator_config, write_client_csvs

AGENTS = 3
QUICK = {"rounds": 5, "faults": ["latency_300ms", "loss_10pct", "partition_30s", "broker_restart"]}
FULL = {"rounds": 20, "faults": ["none", *QUICK["faults"]]}
PARTITION_S = 30.0
START_TIMEOUT_S = 300.0  # fleet up and round 1 closed, on a loaded two-core machine
ROUND_TIMEOUT_S = 20.0  # the coordinator's deadline for a round
DRAIN_TIMEOUT_S = 60.0


def sh(*command: str) -> None:
    """Run a setup command; its error output goes into the exception."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


# --- the network -------------------------------------------------------------------------------


@dataclass
class Gateway:
    """One agent's network namespace and its veth pair (host side in the root namespace)."""

    ns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    dropped: int = 0  # packets its rules dropped, counted when they are replaced

    def create(self) -> None:
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if, "netns", self.ns)
        sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        sh(*self.inside("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if))
        sh(*self.inside("ip", "link", "set", self.ns_if, "up"))
        sh(*self.inside("ip", "link", "set", "lo", "up"))  # paho wakes its loop over a loopback socket pair

    def delete(self) -> None:
        """Remove the veth pair (at once; with the namespace it would go later) and the namespace."""
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, check=False)

    def inside(self, *command: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *command]

    def drop(self, fraction: float) -> None:
        """Drop ``fraction`` of the packets in and out of the gateway (0: none, 1: partition)."""
        self.dropped += self._drops_counted()
        sh(*self.inside("iptables", "-w", "-F"))
        if fraction <= 0:
            return
        chance = [] if fraction >= 1 else ["-m", "statistic", "--mode", "random", "--probability", str(fraction)]
        sh(*self.inside("iptables", "-w", "-A", "INPUT", "-i", self.ns_if, *chance, "-j", "DROP"))
        sh(*self.inside("iptables", "-w", "-A", "OUTPUT", "-o", self.ns_if, *chance, "-j", "DROP"))


    def _drops_counted(self) -> int:
        """Packets the current DROP rules matched (the first column of ``iptables -L -v -x``)."""
        listing = subprocess.run(self.inside("iptables", "-w", "-L", "-v", "-x", "-n"), capture_output=True,
                                 text=True, check=True).stdout
        return sum(int(cols[0]) for cols in map(str.split, listing.splitlines()) if cols[2:3] == ["DROP"])


_FLEETS = itertools.count()


def gateways(count: int) -> list[Gateway]:
    """``count`` gateways with names unique to this fleet and a 10.231.x.0/24 nobody uses here."""
    tag = f"{os.getpid() % 1000:03d}{next(_FLEETS) % 100:02d}"
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    subnet = next(f"10.231.{x}" for x in range(os.getpid() % 200, 256) if f"10.231.{x}." not in taken)
    return [Gateway(f"edgefl-{tag}-gw{i}", f"efh{tag}{i}", f"efn{tag}{i}", f"{subnet}.{4 * i + 1}",
                    f"{subnet}.{4 * i + 2}") for i in range(count)]


class Relay:
    """A TCP relay (root namespace) from one gateway to the broker; every chunk read is written
    ``delay`` seconds later, in order, in each direction: the latency fault."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]):
        self.listen, self.upstream = listen, upstream
        self.delay = 0.0
        self.delayed = 0  # chunks held back so far
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()

    def start(self) -> "Relay":
        self.thread.start()
        self.server = self._call(asyncio.start_server(self._serve, *self.listen))
        return self

    def stop(self) -> None:
        """Stop listening, close every relayed connection, end the loop."""
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.open:
            writer.close()

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:  # broker down: the agent sees its connection refused, as it would
            writer.close()
            return
        self.open |= {writer, up_writer}
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self.open -= {writer, up_writer}

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction until either side closes."""
        held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.create_task(self._deliver(held, writer))
        try:
            while data := await reader.read(65536):
                held.put_nowait((self.loop.time() + self.delay, data))
                self.delayed += self.delay > 0
        except OSError:
            pass
        held.put_nowait(None)
        await sender

    async def _deliver(self, held: asyncio.Queue, writer: asyncio.StreamWriter) -> None:
        try:
            while (item := await held.get()) is not None:
                await asyncio.sleep(item[0] - self.loop.time())
                writer.write(item[1])
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


# --- the fleet ---------------------------------------------------------------------------------


class Broker:
    """mosquitto on 127.0.0.1 with persistence, restartable."""

    def __init__(self, folder: Path):
        self.port, self.dir = free_port(), folder
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "mosquitto.conf"
        self.config.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                               f"persistence true\npersistence_location {folder}/\n")
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = start_mosquitto(self.config, self.dir)
        wait_for_port(self.port, self.process)

    def stop(self) -> None:
        """SIGTERM (mosquitto saves its persistence file), SIGKILL if it hangs."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


@dataclass
class Ledger:
    """What one agent recorded: rounds it sent an update for, and the coordinator's answers."""

    sent: set[int] = field(default_factory=set)
    acknowledged: set[int] = field(default_factory=set)
    refused: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls, events: Path) -> "Ledger":
        ledger = cls()
        lines = events.read_text().splitlines() if events.exists() else []
        for event in map(json.loads, lines):
            if event["event"] == "sent":
                ledger.sent.add(event["round"])
            elif event["event"] == "reply" and event["about"] == "update":
                if event["accepted"] or event["code"] == "duplicate":
                    ledger.acknowledged.add(event["round"])
                else:
                    ledger.refused[event["round"]] = event["code"]
        return ledger


class Fleet:
    """Broker, coordinator and one agent per gateway, started on enter and all stopped on exit."""

    def __init__(self, folder: Path):
        self.dir = folder
        self.db = folder / "coordinator"
        self.broker = Broker(folder / "broker")
        self.gateways = gateways(AGENTS)
        self.relays: list[Relay] = []
        self.coordinator: subprocess.Popen | None = None
        self.agents: list[subprocess.Popen] = []
        self.timeouts: list[str] = []

    def __enter__(self) -> "Fleet":
        try:
            self._start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start(self) -> None:
        port = self.broker.port
        self.broker.start()
        for gateway in self.gateways:
            gateway.create()
            self.relays.append(Relay((gateway.host_ip, port), ("127.0.0.1", port)).start())
        config = coordinator_config(self.dir, port, 10_000, min_clients=AGENTS - 1, start_clients=AGENTS,
                                    round_timeout_s=ROUND_TIMEOUT_S)
        self.coordinator = self._spawn("coordinator", [sys.executable, "-m", "edgefl.cli", "coordinator", "serve",
                                                       "-c", str(config)])
        for index, (gateway, csv) in enumerate(zip(self.gateways, write_client_csvs(self.dir, AGENTS))):
            agent = agent_config(self.dir, port, index, csv, host=gateway.host_ip)
            command = gateway.inside(sys.executable, __file__, "--agent", str(agent),
                                     "--events", str(self.events(index)))
            self.agents.append(self._spawn(f"agent{index}", command))

    def __exit__(self, *_: object) -> None:
        for process in [*self.agents, self.coordinator]:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(30)
        for relay in self.relays:
            relay.stop()
        self.broker.stop()
        for gateway in self.gateways:
            gateway.delete()

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        with (self.dir / f"{name}.log").open("wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def events(self, index: int) -> Path:
        return self.dir / f"agent{index}.events.jsonl"

    # what happened --------------------------------------------------------------------------

    def ask(self, question: Callable[[Store], object]) -> object:
        """Open the coordinator's store, ask, close it (it may not exist yet: None)."""
        if not (self.db / "coordinator.sqlite3").exists():
            return None
        store = Store(self.db)
        try:
            return question(store)
        finally:
            store.close()

    def closed(self) -> int:
        return self.ask(lambda s: sum(r.closed_at is not None for r in s.rounds())) or 0

    def stored(self, client: str) -> set[int]:
        return self.ask(lambda s: {r for r, c, _, _ in s.arrivals() if c == client}) or set()

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> bool:
        """Poll ``condition`` until true; on timeout (or a service's death) the fleet stalled:
        noted, False."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            if any(p.poll() is not None for p in [self.coordinator, *self.agents]):
                what += " (a service exited)"
                break
            time.sleep(0.2)
        self.timeouts.append(what)
        return False

    def wait_rounds(self, count: int) -> bool:
        target = self.closed() + count
        return self.wait(lambda: self.closed() >= target, count * ROUND_TIMEOUT_S * 3, f"{count} rounds to close")

    def drained(self) -> bool:
        """Every update an agent sent is stored or was refused with a code."""
        return all(not self.missing(index) for index in range(AGENTS))

    def missing(self, index: int) -> set[int]:
        ledger = Ledger.read(self.events(index))
        return ledger.sent - self.stored(f"client{index:02d}") - set(ledger.refused)

    def stop(self) -> None:
        """Agents first (nothing new is sent), then the coordinator once it stored what was sent."""
        for agent in self.agents:
            agent.send_signal(signal.SIGTERM)
        for index, agent in enumerate(self.agents):
            self._end(agent, f"agent{index} to stop")
        self.wait(self.drained, DRAIN_TIMEOUT_S, "the coordinator to store every update sent")
        self.coordinator.send_signal(signal.SIGTERM)
        self._end(self.coordinator, "the coordinator to stop")

    def _end(self, process: subprocess.Popen, what: str) -> None:
        """Wait for a process told to stop; kill it (and note the timeout) if it does not."""
        try:
            process.wait(DRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.timeouts.append(what)
            process.kill()
            process.wait(30)

    def losses(self) -> dict:
        """Updates sent but neither stored nor refused (lost), per agent and in all; those of
        them the coordinator had acknowledged; refusals by code; how many got no answer."""
        lost, acknowledged_lost, refused, sent, unanswered = {}, {}, {}, 0, 0
        for index in range(AGENTS):
            client, ledger = f"client{index:02d}", Ledger.read(self.events(index))
            stored = self.stored(client)
            lost[client] = sorted(ledger.sent - stored - set(ledger.refused))
            acknowledged_lost[client] = sorted(ledger.acknowledged - stored)
            refused[client] = ledger.refused
            sent += len(ledger.sent)
            unanswered += len(ledger.sent - ledger.acknowledged - set(ledger.refused))
        return {"updates_lost": sum(map(len, lost.values())), "updates_sent": sent, "unanswered": unanswered,
                "lost": lost, "acknowledged_lost": acknowledged_lost, "refused": refused}


# --- the faults --------------------------------------------------------------------------------


def steady(set_level: Callable[[Fleet, float], None], level: float) -> Callable[[Fleet, int], dict]:
    """A fault that holds for ``rounds`` closed rounds, then is lifted."""

    def run(fleet: Fleet, rounds: int) -> dict:
        set_level(fleet, level)
        try:
            fleet.wait_rounds(rounds)
        finally:
            set_level(fleet, 0.0)
        return {}

    return run


def delay_all(fleet: Fleet, seconds: float) -> None:
    """Latency on every gateway (0: none)."""
    for relay in fleet.relays:
        relay.delay = seconds


def drop_all(fleet: Fleet, fraction: float) -> None:
    """Packet loss on every gateway (0: none)."""
    for gateway in fleet.gateways:
        gateway.drop(fraction)


def partition(fleet: Fleet, rounds: int) -> dict:
    """The last gateway is cut off for ``PARTITION_S``; after it heals, wait until it has an
    update stored for a round that opened after the heal, then ``rounds`` more rounds."""
    gateway, client = fleet.gateways[-1], f"client{AGENTS - 1:02d}"
    before = fleet.closed()
    gateway.drop(1.0)
    try:
        time.sleep(PARTITION_S)
    finally:
        gateway.drop(0.0)
    during, healed_in = fleet.closed() - before, fleet.closed() + 1
    fleet.wait(lambda: max(fleet.stored(client), default=0) >= healed_in, 120, f"{client} to report after the heal")
    fleet.wait_rounds(rounds)
    return {"rounds_during_partition": during}


def broker_restart(fleet: Fleet, rounds: int) -> dict:
    """Restart mosquitto as round 2 opens (updates in flight), then ``rounds`` more rounds."""
    fleet.broker.stop()
    fleet.broker.start()
    fleet.wait_rounds(rounds)
    return {}


FAULTS: dict[str, Callable[[Fleet, int], dict]] = {
    "none": steady(delay_all, 0.0),
    "latency_300ms": steady(delay_all, 0.3),
    "loss_10pct": steady(drop_all, 0.10),
    "partition_30s": partition,
    "broker_restart": broker_restart,
}


def run_fault(name: str, rounds: int, folder: Path) -> dict:
    """One fleet through one fault: ``{"fault", "rounds_completed", "updates_lost", ...}``."""
    started = time.perf_counter()
    folder.mkdir(parents=True)
    with Fleet(folder) as fleet:
        ready = fleet.wait(lambda: fleet.closed() >= 1, START_TIMEOUT_S, "round 1 to close")
        first = fleet.closed()
        extras = FAULTS[name](fleet, rounds) if ready else {}
        completed = fleet.closed() - first
        fleet.stop()
        losses = fleet.losses()
    evidence = {"packets_dropped": sum(g.dropped for g in fleet.gateways),
                "chunks_delayed": sum(r.delayed for r in fleet.relays)}
    return {"fault": name, "rounds_completed": completed, **losses, **extras, **evidence,
            "timeouts": fleet.timeouts, "seconds": round(time.perf_counter() - started, 1)}


def check_machine() -> None:
    """Root and the tools the bench drives, or an error that says what is missing."""
    missing = [tool for tool in ("ip", "iptables", "mosquitto") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError(f"the fault bench needs {', '.join(missing)} (Debian: apt-get install iproute2 "
                           "iptables mosquitto)")
    if os.geteuid() != 0:
        raise RuntimeError("the fault bench makes network namespaces: run it as root")


def run_faults(quick: bool, keep: Path | None = None) -> list[dict]:
    """Every fault of the quick or full set, one fresh fleet each; logs under ``keep`` if given."""
    check_machine()
    settings = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="edgefl-faults-") as scratch:
        folder = keep or Path(scratch)
        return [run_fault(name, settings["rounds"], folder / name) for name in settings["faults"]]


def serve_agent(config: Path, events: Path) -> None:
    """Run one real ``Agent`` until SIGTERM or the end of the run, appending each of its events
    (updates sent, the coordinator's replies) to ``events`` as a JSON line."""
    from edge_agent.agent import Agent
    from edge_agent.config import AgentConfig, load_config

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with events.open("a") as out:
        def record(kind: str, data: dict) -> None:
            out.write(json.dumps({"event": kind, "at": time.time(), **data}) + "\n")
            out.flush()

        Agent(load_config(config, AgentConfig), on_event=record).run(stop=stopped.is_set)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the four faults, 5 rounds each (a few minutes)")
    parser.add_argument("--keep", type=Path, help="keep every fleet's logs and state in this new folder")
    parser.add_argument("--agent", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--events", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agent:
        serve_agent(args.agent, args.events)
        return
    results = run_faults(args.quick, args.keep)
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
