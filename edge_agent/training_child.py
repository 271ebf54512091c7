"""One round of local training in a child process, so the agent's MQTT loop (session, refusals,
presence, forecasts) never waits for it and the memory training takes goes back to the system
when the round ends.

The agent writes a job (its config and the round, JSON, mode 0600) and starts ``python -m
edge_agent.training_child <job>``, a fresh interpreter (no fork of a threaded process). In head
mode, ``python -m edge_agent.round_data`` runs first and exits: it prepares the round's data and
the anchors' forecasts (pandas, statsforecast), so this process, which holds torch, holds neither
of them. The child rebuilds the learner from the state folder (the global state the agent accepted and its personal
state, as after a restart), trains, and makes the result durable as the agent did in-process:
the personal state and the encoded update (the wire envelope: JSON header + safetensors body) go
to the state folder, then the round is marked done. Its answer is a small JSON file (status, loss,
peak memory, its own and the data process's); nothing is pickled. A child that dies (killed, out of memory) leaves no answer: the
agent skips the round as it skips a diverged one."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent import round_data
from edge_agent.config import AgentConfig
from edge_agent.round_data import DATA_JOB_FILE, PEAK, ROUND_DATA, DataJob, peak_rss_mb
from edge_agent.storage import write_bytes_atomically

if TYPE_CHECKING:
    from edge_agent.learners import Learner

log = logging.getLogger("edgefl.agent")
FOLDER, JOB_FILE, RESULT_FILE = "training", "job.json", "result.json"
STOP_WAIT_S = 10.0


class Step(NamedTuple):
    """One child process of a round: its module (run with ``-m``), its job file, what the log says
    it is doing and what it is called in a failed round's reason."""

    module: str
    job: str
    doing: str
    process: str


DATA_STEP = Step(round_data.__name__, DATA_JOB_FILE, "preparing its data", "data process")
TRAINING_STEP = Step(__name__, JOB_FILE, "training", "training process")


class RoundJob(BaseModel):
    """What the child trains: the agent's config, the round and its announcement, and the sensor
    metrics the agent's ingest counted (they go into the update)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: AgentConfig
    round: int = Field(ge=1)
    announced: str = Field(description="the round announcement's body_sha256, which the update names")
    metrics: dict[str, float] = {}


class TrainingOutcome(BaseModel):
    """The child's answer: ``sent`` (the update is in the state folder, the round marked done) or
    ``failed`` (nothing saved: the agent skips the round), with the loss and the peak resident
    memory of the child and of the data process that ran before it (0: none ran)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int
    status: Literal["sent", "failed"]
    loss: float | None = None
    reason: str = ""
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    data_peak_rss_mb: float = 0.0


class TrainingChild:
    """A round being trained in child processes, one after the other (the data process in head
    mode, then the training process); ``result`` polls them without waiting."""

    def __init__(self, cfg: AgentConfig, round_index: int, announced: str, metrics: dict[str, float]):
        self.round = round_index
        self.folder = Path(cfg.state_dir) / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (RESULT_FILE, ROUND_DATA):
            (self.folder / stale).unlink(missing_ok=True)
        job = RoundJob(config=cfg, round=round_index, announced=announced, metrics=metrics)
        write_bytes_atomically(self.folder / JOB_FILE, job.model_dump_json(exclude_unset=True).encode(), mode=0o600)
        self.steps = [TRAINING_STEP]
        if cfg.mode == round_data.MODE:
            data_job = DataJob.of(cfg).model_dump_json(exclude_unset=True).encode()
            write_bytes_atomically(self.folder / DATA_JOB_FILE, data_job, mode=0o600)
            self.steps.insert(0, DATA_STEP)
        self.process = self._start_next()

    def _start_next(self) -> subprocess.Popen:
        """The next step's process (``python -m <module> <its job>``)."""
        self.step = self.steps.pop(0)
        process = subprocess.Popen([sys.executable, "-m", self.step.module, str(self.folder / self.step.job)])
        log.info("round %d: %s in child process %d", self.round, self.step.doing, process.pid)
        return process

    def result(self, timeout: float = 0.0) -> TrainingOutcome | None:
        """The training process's answer once it has exited (waiting up to ``timeout`` seconds),
        else None; a step that exited without one (or with an error) failed the round."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                code = self.process.wait(max(0.0, deadline - time.monotonic())) if timeout else self.process.poll()
            except subprocess.TimeoutExpired:
                return None
            if code is None:
                return None
            if code or not self.steps:
                break
            self.process = self._start_next()
        for used in (JOB_FILE, DATA_JOB_FILE, ROUND_DATA):
            (self.folder / used).unlink(missing_ok=True)
        try:
            return TrainingOutcome.model_validate_json((self.folder / RESULT_FILE).read_bytes())
        except (OSError, ValueError) as err:
            return TrainingOutcome(round=self.round, status="failed", reason=f"the {self.step.process} exited with code "
                               f"{code} and no result ({err.__class__.__name__})")

    def stop(self) -> None:
        """End the child (the agent is stopping): the round stays untrained and is trained again
        after a restart, as when the agent dies while training."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def round_learner(cfg: AgentConfig, folder: Path) -> tuple[Learner, float]:
    """The round's learner and the data process's peak memory (MB): in head mode on the data and
    anchor forecasts ``edge_agent.round_data`` left in ``folder``, in the other modes on the
    gateway's table read here (no data process: 0 MB)."""
    from edge_agent.learners import head_learner, make_learner

    if cfg.mode != round_data.MODE:
        from edge_agent.live import gateway_table

        return make_learner(cfg, gateway_table(cfg)), 0.0
    from edge_agent.data.arrays import ClientArrays
    from edge_agent.data.windows import client_data

    with np.load(folder / ROUND_DATA) as npz:
        data = client_data(ClientArrays.from_npz(npz))
        data.memo.update(round_data.anchor_memo(npz, cfg.training.anchors))
        return head_learner(cfg, data), float(npz[PEAK])


def train_round(job: RoundJob, folder: Path) -> TrainingOutcome:
    """Train ``job.round`` on the learner restored from the state folder and save its update."""
    from edge_agent.protocol import UpdateHeader, encode
    from edge_agent.state import AgentState
    from edge_agent.tensors import first_non_finite

    cfg, started = job.config, time.perf_counter()
    files = AgentState(cfg.state_dir)
    learner, data_peak = round_learner(cfg, folder)
    learner = files.restore(learner)
    serving = learner.serving_metrics(job.round)
    loss = learner.train(job.round)
    wire = learner.wire_state(job.round)
    if not math.isfinite(loss) or first_non_finite(wire) is not None:
        return TrainingOutcome(round=job.round, status="failed", loss=loss if math.isfinite(loss) else None,
                           reason=f"local training diverged (loss {loss} or non-finite parameters)",
                           data_peak_rss_mb=data_peak)
    metrics = {"loss": loss, "seconds": time.perf_counter() - started, **serving, **job.metrics}
    if not all(math.isfinite(v) for v in metrics.values()):
        log.warning("round %d: leaving out non-finite metrics %s", job.round, metrics)
    header = UpdateHeader(fleet=cfg.fleet, sender=cfg.client_id, round=job.round, n_samples=learner.n_samples,
                          metrics={k: v for k, v in metrics.items() if math.isfinite(v)}, campaign=files.campaign,
                          global_sha256=job.announced)
    files.save_round(learner, job.round, encode(header, wire))
    return TrainingOutcome(round=job.round, status="sent", loss=loss, seconds=time.perf_counter() - started,
                       data_peak_rss_mb=data_peak)


def main(job_path: Path) -> None:
    """The child: run the job, then write its answer next to it with the peak memory it took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    job = RoundJob.model_validate_json(job_path.read_bytes())
    result = train_round(job, job_path.parent)
    answer = result.model_copy(update={"peak_rss_mb": round(peak_rss_mb(), 1)})
    write_bytes_atomically(job_path.parent / RESULT_FILE, answer.model_dump_json().encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
