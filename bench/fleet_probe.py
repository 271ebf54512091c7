"""What ``bench/fleet_load.py`` observes from outside the coordinator: a monitor client that
timestamps round announcements and the coordinator's answers, and a sampler of a process's
memory and CPU time from ``/proc`` (no changes to the services are needed to measure them)."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from mqtt_bench import connected_client, envelope_header

from edge_agent.asked import asked_count

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Monitor:
    """Subscribes to a fleet's round, coordinator status and every agent's task topic.

    ``announced[r]``: when round r was first announced; the finished announcement after round R
    counts as ``announced[R + 1]``. ``accepted[r]``: when each accepted update of round r was
    answered (the coordinator answers once the update is durable)."""

    def __init__(self, port: int, fleet: str):
        self.root = f"edgefl/{fleet}"
        self.announced: dict[int, float] = {}
        self.asked: dict[int, int] = {}  # round -> participants named by its announcement (sampled rounds)
        self.accepted: dict[int, list[float]] = defaultdict(list)
        self.rejected: Counter = Counter()
        self.online, self.finished = threading.Event(), threading.Event()
        self.client = connected_client(f"monitor-{fleet}", port)
        self.client.on_message = self._on_message
        self.client.subscribe([(f"{self.root}/round", 1), (f"{self.root}/coordinator/status", 1),
                               (f"{self.root}/agents/+/task", 1)])

    def _on_message(self, _c, _u, message) -> None:
        now = time.monotonic()
        if message.topic.endswith("/coordinator/status"):
            if message.payload == b"online":
                self.online.set()
            return
        if not message.payload:
            return
        header = envelope_header(message.payload)
        if header["kind"] == "round":
            self.announced.setdefault(header["round"] + header["finished"], now)
            count = asked_count(header.get("participants"), header.get("asked"))
            if count is not None:
                self.asked[header["round"]] = count
            if header["finished"]:
                self.finished.set()
        elif header["kind"] == "reply" and header["about"] == "update" and header["accepted"]:
            self.accepted[header["round"]].append(now)
        elif header["kind"] == "reply" and not header["accepted"]:
            self.rejected[header["code"]] += 1

    def wait_online(self, timeout: float) -> None:
        if not self.online.wait(timeout):
            raise TimeoutError("the coordinator did not come online")

    def wait_finished(self, timeout: float) -> bool:
        return self.finished.wait(timeout)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class ProcessProbe:
    """Samples a process's resident memory (VmRSS, VmHWM) and CPU seconds (utime + stime) every
    ``every_s`` on a background thread until it exits or ``stop``."""

    def __init__(self, pid: int, every_s: float = 0.2):
        self.pid, self.every_s = pid, every_s
        self.samples: list[tuple[float, float]] = []  # (monotonic time, CPU seconds)
        self.rss_mb = self.hwm_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                return
            memory = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status.splitlines()
                      if line.startswith(("VmRSS", "VmHWM"))}
            if not memory:  # a zombie: exited, not yet reaped
                return
            self.rss_mb, self.hwm_mb = round(memory["VmRSS"], 1), round(memory["VmHWM"], 1)
            self.samples.append((time.monotonic(), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS))
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_s(self) -> float:
        return self.samples[-1][1] if self.samples else 0.0

    def cpu_between(self, start: float, end: float) -> float:
        """CPU seconds used between two monotonic times (the samples nearest before each)."""
        def at(t: float) -> float:
            before = [cpu for when, cpu in self.samples if when <= t]
            return before[-1] if before else 0.0
        return round(at(end) - at(start), 2)


def folder_bytes(folder: Path) -> int:
    """The size of every file under ``folder``."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
