"""One round of local training in a child process, so the agent's MQTT loop (session, refusals,
presence, forecasts) never waits for it, the memory training takes goes back to the system
when the round ends, and the agent itself never loads torch. Whatever else needs the learner runs
here too (``RoundJob.task``): exporting the served bundle after an accepted global model, and
installing a personal message of the round's strategy.

The agent writes a job (its config and the round, JSON, mode 0600) and starts ``python -m
edge_agent.training_child <job>``, a fresh interpreter (no fork of a threaded process). In head
mode, ``python -m edge_agent.round_data`` runs first and exits: it prepares the round's data and
the anchors' forecasts (pandas, statsforecast), so this process, which holds torch, holds neither
of them. The child rebuilds the learner from the state folder (the global state the agent accepted and its personal
state, as after a restart), trains, and makes the result durable as the agent did in-process:
the personal state and the encoded update (the wire envelope: JSON header + safetensors body) go
to the state folder, then the round is marked done. Its answer is a small JSON file (status, loss,
peak memory, its own and the data process's); nothing is pickled. A child that dies (killed, out of memory) leaves no answer: the
agent skips the round as it skips a diverged one (an export keeps the last bundle, a personal
message is ignored)."""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent import round_data
from edge_agent.children import ChildSteps, Step, remaining, write_job
from edge_agent.config import AgentConfig
from edge_agent.round_data import DATA_JOB_FILE, PEAK, ROUND_DATA, DataJob, peak_rss_mb
from edge_agent.storage import write_bytes_atomically

if TYPE_CHECKING:
    from edge_agent.learners import Learner
    from edge_agent.state import AgentState

log = logging.getLogger("edgefl.agent")
FOLDER, JOB_FILE, RESULT_FILE, PERSONAL_FILE = "training", "job.json", "result.json", "personal.safetensors"
EXPORT_JOB_FILE, EXPORT_RESULT_FILE = "export_job.json", "export_result.json"
ANSWER_OF = {JOB_FILE: RESULT_FILE, EXPORT_JOB_FILE: EXPORT_RESULT_FILE}


DATA_STEP = Step(round_data.__name__, DATA_JOB_FILE, "preparing its data", "data process")
EXPORT_STEP = Step(__name__, EXPORT_JOB_FILE, "exporting the served bundle", "export process")
TRAINING_STEP = Step(__name__, JOB_FILE, "training", "training process")
DOING = {"train": "training", "personal": "installing the personal message"}


Task = Literal["train", "export", "personal"]


class RoundJob(BaseModel):
    """What the child does: the agent's config, the round and its announcement, and the sensor
    metrics the agent's ingest counted (they go into the update). ``task``: train the round, only
    export the served bundle, or install the personal message the agent left in ``PERSONAL_FILE``;
    with ``export_round``, the bundle served once that round is announced is exported first, by a
    process of its own (``EXPORT_STEP``), with ``bundle_writer`` (``module:function``, an
    ``edge_agent.serving.renewal.BundleWriter``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: AgentConfig
    round: int = Field(ge=0)
    announced: str = Field("", description="the round announcement's body_sha256, which the update names")
    metrics: dict[str, float] = {}
    task: Task = "train"
    export_round: int | None = Field(None, ge=1)
    bundle_writer: str = ""


class TrainingOutcome(BaseModel):
    """The child's answer: ``sent`` (the update is in the state folder, the round marked done),
    ``done`` (an export or a personal message handled) or ``failed`` (nothing saved: the agent
    skips the round or ignores the message), with the loss, whether a new bundle was exported and
    the peak resident memory of the child and of the data process that ran before it (0: none ran)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round: int
    status: Literal["sent", "done", "failed"]
    loss: float | None = None
    n_samples: int | None = Field(None, ge=1, description="the samples the round's learner held")
    reason: str = ""
    seconds: float = 0.0
    exported: bool = False
    peak_rss_mb: float = 0.0
    data_peak_rss_mb: float = 0.0


class TrainingChild:
    """A round's job in child processes, one after the other (the data process in head mode, the
    export process when a bundle is to be served, then the training process); ``result`` polls
    them without waiting, and ``new_bundle`` says when the export process has written a bundle."""

    def __init__(self, job: RoundJob, personal: bytes = b""):
        """``personal``: the safetensors body of the personal message a ``personal`` job installs."""
        cfg, self.job, self.round = job.config, job, job.round
        self.folder = Path(cfg.state_dir) / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (RESULT_FILE, ROUND_DATA):
            (self.folder / stale).unlink(missing_ok=True)
        for stale in ANSWER_OF.values():
            (self.folder / stale).unlink(missing_ok=True)
        if job.task == "personal":
            write_bytes_atomically(self.folder / PERSONAL_FILE, personal, mode=0o600)
        steps: list[Step] = []
        if cfg.mode == round_data.MODE:
            write_job(self.folder, DATA_JOB_FILE, DataJob.of(cfg))
            steps.append(DATA_STEP)
        if job.export_round is not None:
            write_job(self.folder, EXPORT_JOB_FILE, job.model_copy(update={"task": "export"}))
            steps.append(EXPORT_STEP)
        if job.task != "export":
            write_job(self.folder, JOB_FILE, job)
            steps.append(TRAINING_STEP._replace(doing=DOING[job.task]))
        self.new_bundle = False
        self.children = ChildSteps(self.folder, steps, f"round {job.round}")

    def result(self, timeout: float = 0.0) -> TrainingOutcome | None:
        """The training process's answer once it has exited (waiting up to ``timeout`` seconds),
        else None; a step that exited without one (or with an error) failed the round."""
        deadline = time.monotonic() + timeout
        while (code := self.children.exit_code(remaining(deadline))) is not None:
            step = self.children.step
            if step is EXPORT_STEP:
                self._exported(code)
            if (code and step is not EXPORT_STEP) or not self.children.advance():
                return self._answer(step, code)
        return None

    def _answer(self, step: Step, code: int) -> TrainingOutcome:
        """The answer ``step`` left (a failed round's if none), the round's files removed."""
        try:
            answer = self.folder / ANSWER_OF.get(step.job, RESULT_FILE)
            return TrainingOutcome.model_validate_json(answer.read_bytes())
        except (OSError, ValueError) as err:
            return TrainingOutcome(round=self.round, status="failed", reason=f"the {step.process} exited with code "
                                   f"{code} and no result ({err.__class__.__name__})")
        finally:
            for used in (JOB_FILE, DATA_JOB_FILE, EXPORT_JOB_FILE, ROUND_DATA, PERSONAL_FILE, *ANSWER_OF.values()):
                (self.folder / used).unlink(missing_ok=True)

    def _exported(self, code: int) -> None:
        """The export process is done: a new bundle to serve at once, or the last one kept (a
        failed export never stops the round's training)."""
        try:
            outcome = TrainingOutcome.model_validate_json((self.folder / EXPORT_RESULT_FILE).read_bytes())
        except (OSError, ValueError):
            log.warning("round %d: the export process exited with code %d and no result; forecasts keep the last "
                        "bundle", self.round, code)
            return
        self.new_bundle = outcome.exported
        log.info("round %d: export process done (export process peak %.0f MB)", self.round, outcome.peak_rss_mb)

    def take_new_bundle(self) -> bool:
        """Whether a new bundle was exported since the last call."""
        new, self.new_bundle = self.new_bundle, False
        return new

    def stop(self) -> None:
        """End the child (the agent is stopping): the round stays untrained and is trained again
        after a restart, as when the agent dies while training."""
        self.children.stop()


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


def run_job(job: RoundJob, folder: Path) -> TrainingOutcome:
    """Do ``job.task`` on the learner restored from the state folder."""
    from edge_agent.serving.renewal import export_bundle
    from edge_agent.state import AgentState

    files, started = AgentState(job.config.state_dir), time.perf_counter()
    learner, data_peak = round_learner(job.config, folder)
    learner = files.restore(learner)
    if job.task == "export":
        outcome = TrainingOutcome(round=job.round, status="done", exported=export_bundle(
            job.bundle_writer, learner, job.config, job.export_round))
    elif job.task == "train":
        outcome = train_round(job, files, learner, started)
    else:
        outcome = install_personal(job, files, learner, folder)
    return outcome.model_copy(update={"data_peak_rss_mb": data_peak})


def install_personal(job: RoundJob, files: AgentState, learner: Learner, folder: Path) -> TrainingOutcome:
    """Install the personal message the agent left (the agent checked its values are finite) and
    save the personal state; one the learner refuses is ignored, naming why."""
    from edge_agent.tensors import read_tensors

    try:
        learner.install_personal(read_tensors(folder / PERSONAL_FILE))
    except (KeyError, ValueError, RuntimeError) as err:
        return TrainingOutcome(round=job.round, status="failed", reason=str(err))
    files.save_personal(learner)
    return TrainingOutcome(round=job.round, status="done")


def train_round(job: RoundJob, files: AgentState, learner: Learner, started: float) -> TrainingOutcome:
    """Train ``job.round`` on ``learner`` (restored from the state folder) and save its update
    (``started``: when the job began, for the seconds it reports)."""
    from edge_agent.protocol import UpdateHeader, encode
    from edge_agent.tensors import first_non_finite

    cfg = job.config
    serving = learner.serving_metrics(job.round)
    loss = learner.train(job.round)
    wire = learner.wire_state(job.round)
    if not math.isfinite(loss) or first_non_finite(wire) is not None:
        return TrainingOutcome(round=job.round, status="failed", loss=loss if math.isfinite(loss) else None,
                               reason=f"local training diverged (loss {loss} or non-finite parameters)")
    metrics = {"loss": loss, "seconds": time.perf_counter() - started, **serving, **job.metrics}
    if not all(math.isfinite(v) for v in metrics.values()):
        log.warning("round %d: leaving out non-finite metrics %s", job.round, metrics)
    header = UpdateHeader(fleet=cfg.fleet, sender=cfg.client_id, round=job.round, n_samples=learner.n_samples,
                          metrics={k: v for k, v in metrics.items() if math.isfinite(v)}, campaign=files.campaign,
                          global_sha256=job.announced)
    files.save_round(learner, job.round, encode(header, wire))
    return TrainingOutcome(round=job.round, status="sent", loss=loss, n_samples=learner.n_samples,
                           seconds=time.perf_counter() - started)


def main(job_path: Path) -> None:
    """The child: run the job, then write its answer next to it with the peak memory it took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    job = RoundJob.model_validate_json(job_path.read_bytes())
    result = run_job(job, job_path.parent)
    answer = result.model_copy(update={"peak_rss_mb": round(peak_rss_mb(), 1)})
    write_bytes_atomically(job_path.parent / ANSWER_OF[job_path.name], answer.model_dump_json().encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
