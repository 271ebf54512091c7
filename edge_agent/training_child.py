"""One round of local training in a child process, so the agent's MQTT loop (session, refusals,
presence, forecasts) never waits for it and the memory training takes goes back to the system
when the round ends.

The agent writes a job (its config and the round, JSON, mode 0600) and starts ``python -m
edge_agent.training_child <job>``, a fresh interpreter (no fork of a threaded process). The child
rebuilds the learner from the state folder (the global state the agent accepted and its personal
state, as after a restart), trains, and makes the result durable as the agent did in-process:
the personal state and the encoded update (the wire envelope: JSON header + safetensors body) go
to the state folder, then the round is marked done. Its answer is a small JSON file (status, loss,
peak memory); nothing is pickled. A child that dies (killed, out of memory) leaves no answer: the
agent skips the round as it skips a diverged one."""

from __future__ import annotations

import logging
import math
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.config import AgentConfig
from edge_agent.storage import write_bytes_atomically

log = logging.getLogger("edgefl.agent")
FOLDER, JOB_FILE, RESULT_FILE = "training", "job.json", "result.json"
STOP_WAIT_S = 10.0


class RoundJob(BaseModel):
    """What the child trains: the agent's config, the round and its announcement, and the sensor
    metrics the agent's ingest counted (they go into the update)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: AgentConfig
    round: int = Field(ge=1)
    announced: str = Field(description="the round announcement's body_sha256, which the update names")
    metrics: dict[str, float] = {}


class RoundResult(BaseModel):
    """The child's answer: ``sent`` (the update is in the state folder, the round marked done) or
    ``failed`` (nothing saved: the agent skips the round), with the loss and the child's peak
    resident memory."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int
    status: Literal["sent", "failed"]
    loss: float | None = None
    reason: str = ""
    seconds: float = 0.0
    peak_rss_mb: float = 0.0


class TrainingChild:
    """A round being trained in a child process; ``result`` polls it without waiting."""

    def __init__(self, cfg: AgentConfig, round_index: int, announced: str, metrics: dict[str, float]):
        self.round = round_index
        self.folder = Path(cfg.state_dir) / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / RESULT_FILE).unlink(missing_ok=True)
        job = RoundJob(config=cfg, round=round_index, announced=announced, metrics=metrics)
        write_bytes_atomically(self.folder / JOB_FILE, job.model_dump_json(exclude_unset=True).encode(), mode=0o600)
        self.process = subprocess.Popen([sys.executable, "-m", __name__, str(self.folder / JOB_FILE)])
        log.info("round %d: training in child process %d", round_index, self.process.pid)

    def result(self, timeout: float = 0.0) -> RoundResult | None:
        """The child's answer once it has exited (waiting up to ``timeout`` seconds), else None; a
        child that exited without one failed."""
        try:
            code = self.process.wait(timeout) if timeout else self.process.poll()
        except subprocess.TimeoutExpired:
            return None
        if code is None:
            return None
        (self.folder / JOB_FILE).unlink(missing_ok=True)
        try:
            return RoundResult.model_validate_json((self.folder / RESULT_FILE).read_bytes())
        except (OSError, ValueError) as err:
            return RoundResult(round=self.round, status="failed", reason=f"the training process exited with code "
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


def train_round(job: RoundJob) -> RoundResult:
    """Train ``job.round`` on the learner restored from the state folder and save its update."""
    from edge_agent.learners import make_learner
    from edge_agent.live import gateway_table
    from edge_agent.protocol import UpdateHeader, encode
    from edge_agent.state import AgentState
    from edge_agent.tensors import first_non_finite

    cfg, started = job.config, time.perf_counter()
    files = AgentState(cfg.state_dir)
    learner = files.restore(make_learner(cfg, gateway_table(cfg)))
    serving = learner.serving_metrics(job.round)
    loss = learner.train(job.round)
    wire = learner.wire_state(job.round)
    if not math.isfinite(loss) or first_non_finite(wire) is not None:
        return RoundResult(round=job.round, status="failed", loss=loss if math.isfinite(loss) else None,
                           reason=f"local training diverged (loss {loss} or non-finite parameters)")
    metrics = {"loss": loss, "seconds": time.perf_counter() - started, **serving, **job.metrics}
    if not all(math.isfinite(v) for v in metrics.values()):
        log.warning("round %d: leaving out non-finite metrics %s", job.round, metrics)
    header = UpdateHeader(fleet=cfg.fleet, sender=cfg.client_id, round=job.round, n_samples=learner.n_samples,
                          metrics={k: v for k, v in metrics.items() if math.isfinite(v)}, campaign=files.campaign,
                          global_sha256=job.announced)
    files.save_round(learner, job.round, encode(header, wire))
    return RoundResult(round=job.round, status="sent", loss=loss, seconds=time.perf_counter() - started)


def peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` of its own address space (``ru_maxrss``
    would count the agent's size at the fork before ``exec``), ``ru_maxrss`` where /proc is absent."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def main(job_path: Path) -> None:
    """The child: run the job, then write its answer next to it with the peak memory it took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    job = RoundJob.model_validate_json(job_path.read_bytes())
    result = train_round(job)
    answer = result.model_copy(update={"peak_rss_mb": round(peak_rss_mb(), 1)})
    write_bytes_atomically(job_path.parent / RESULT_FILE, answer.model_dump_json().encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
