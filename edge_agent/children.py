"""Child processes of the training agent, run one after the other and polled without waiting, so
the agent's loop (session, replies, presence, forecasts) never blocks on them and the memory
they take (torch, pandas, statsforecast) goes back to the system when each exits.

Each step is ``python -m <module> <job file>``, a fresh interpreter (no fork of a threaded
process): the agent writes the job (JSON, mode 0600), the child writes its answer next to it."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel

from edge_agent.storage import write_bytes_atomically

log = logging.getLogger("edgefl.agent")
STOP_WAIT_S = 10.0


class Step(NamedTuple):
    """One child process: its module (run with ``-m``), its job file, what the log says it is
    doing and what it is called in a failure's reason."""

    module: str
    job: str
    doing: str
    process: str


def write_job(folder: Path, name: str, job: BaseModel) -> None:
    """A child's job file, readable by the agent's user only (it holds the config)."""
    write_bytes_atomically(folder / name, job.model_dump_json(exclude_unset=True).encode(), mode=0o600)


class ChildSteps:
    """``steps`` run in ``folder`` one after the other; ``label`` starts their log lines."""

    def __init__(self, folder: Path, steps: list[Step], label: str):
        self.folder, self.steps, self.label = folder, list(steps), label
        self.process = self._start_next()

    def _start_next(self) -> subprocess.Popen:
        self.step = self.steps.pop(0)
        process = subprocess.Popen([sys.executable, "-m", self.step.module, str(self.folder / self.step.job)])
        log.info("%s: %s in child process %d", self.label, self.step.doing, process.pid)
        return process

    def exit_code(self, timeout: float = 0.0) -> int | None:
        """The current step's exit code once it has ended (waiting up to ``timeout`` s), else None."""
        if not timeout:
            return self.process.poll()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def advance(self) -> bool:
        """Start the next step; False when none is left."""
        if not self.steps:
            return False
        self.process = self._start_next()
        return True

    def stop(self) -> None:
        """End the running step (the agent is stopping) and drop the ones not yet started."""
        self.steps.clear()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic``), never negative."""
    return max(0.0, deadline - time.monotonic())
