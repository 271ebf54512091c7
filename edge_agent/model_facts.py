"""What the training agent knows of its model without holding it: the facts a learner shows (what
its hello says, how its global state is laid out, the norm a new global model is measured
against, how large its updates are) and, for a gateway that cannot train yet, the same of the
fleet's initial model.

The agent never loads torch: ``python -m edge_agent.model_facts <job>`` builds the learner on the
gateway's table with the state folder restored (as the training child does), writes these facts
as a small JSON file (strict pydantic, nothing pickled) and exits. The agent runs it at start
(waiting: ``model_facts``) and, while a live gateway's history is not yet trainable, in the
background when that history has grown (``FactsChild``, polled by the agent's loop); it checks
every incoming global state against the facts, in numpy. Once it trains, the training child
reports the sample count of each round's history."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from edge_agent.children import ChildSteps, Step, write_job
from edge_agent.config import AgentConfig
from edge_agent.data.errors import DataError
from edge_agent.storage import write_bytes_atomically
from edge_agent.tensors import Layout, TensorDict, dtype_name

log = logging.getLogger("edgefl.agent")
FOLDER, JOB_FILE, ANSWER_FILE = "training", "facts_job.json", "facts.json"
FACTS_STEP = Step(__name__, JOB_FILE, "reading the learner's facts", "model facts process")
FACTS_TIMEOUT_S = 1800.0
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True)


class TensorSpec(BaseModel):
    """One tensor's shape and dtype name (``float32``)."""

    model_config = STRICT

    shape: list[int]
    dtype: str


class FleetFacts(BaseModel):
    """The fleet's initial model (``fleet_template``): its signature, the layout of its global
    state and that state's L2 norm (the reference a gateway without a learner checks against)."""

    model_config = STRICT

    signature: str
    layout: dict[str, TensorSpec]
    norm: float


class LearnerFacts(FleetFacts):
    """The gateway's learner: what its hello says; ``layout`` and ``norm`` of the global part of its
    wire state as restored from the state folder, ``fresh_norm`` of a fresh learner's (the reference
    once a new campaign is joined), the bytes of an update's envelope and what the loader did to
    the table that the user should hear of (``notes``)."""

    n_features: int = Field(ge=1)
    n_samples: int = Field(ge=1)
    latitude: float | None = None
    longitude: float | None = None
    notes: list[str] = []
    fresh_norm: float
    update_bytes: int = Field(ge=0)


class ModelFacts(BaseModel):
    """The child's answer: the learner's facts, or the reason the gateway's data gives none
    (``problem``; ``data`` for a ``DataError``, ``value`` for another ``ValueError``); without the
    learner's, the fleet's facts in head mode (what a gateway that cannot train yet keeps the
    fleet's model by)."""

    model_config = STRICT

    learner: LearnerFacts | None = None
    fleet: FleetFacts | None = None
    problem: str = ""
    problem_kind: str = ""
    peak_rss_mb: float = 0.0


class FactsJob(BaseModel):
    """What the child builds: the agent's config, the round it trained last, whether it has a
    table to build a learner on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: AgentConfig
    trained_round: int = Field(ge=0)
    with_learner: bool = True


def spec_layout(specs: dict[str, TensorSpec]) -> Layout:
    """The ``Layout`` the specs describe (dtypes by name)."""
    return {name: (tuple(spec.shape), spec.dtype) for name, spec in specs.items()}


def _specs(state: TensorDict) -> dict[str, TensorSpec]:
    return {name: TensorSpec(shape=list(t.shape), dtype=dtype_name(t.dtype)) for name, t in state.items()}


class FactsChild:
    """The facts child for one job, started at once and polled without waiting (``result``)."""

    def __init__(self, cfg: AgentConfig, trained_round: int, with_learner: bool):
        self.folder = Path(cfg.state_dir) / FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / ANSWER_FILE).unlink(missing_ok=True)
        write_job(self.folder, JOB_FILE, FactsJob(config=cfg, trained_round=trained_round, with_learner=with_learner))
        self.children = ChildSteps(self.folder, [FACTS_STEP], "model facts")

    def result(self, timeout: float = 0.0) -> ModelFacts | None:
        """The child's answer once it has exited (waiting up to ``timeout`` s), else None; a child
        that exited without one raises ``RuntimeError``."""
        code = self.children.exit_code(timeout)
        if code is None:
            return None
        (self.folder / JOB_FILE).unlink(missing_ok=True)
        answer = self.folder / ANSWER_FILE
        if code or not answer.is_file():
            raise RuntimeError(f"the model facts process exited with code {code} and no answer "
                               "(its traceback is above)")
        facts = ModelFacts.model_validate_json(answer.read_bytes())
        answer.unlink()
        log.info("model facts from a child process (model facts process peak %.0f MB)", facts.peak_rss_mb)
        return facts

    def stop(self) -> None:
        self.children.stop()
        (self.folder / JOB_FILE).unlink(missing_ok=True)


def raise_problem(facts: ModelFacts) -> ModelFacts:
    """``facts``, or the ``DataError`` or ``ValueError`` the child met, raised as in-process."""
    if facts.problem_kind == "data":
        raise DataError(facts.problem)
    if facts.problem_kind:
        raise ValueError(facts.problem)
    return facts


def model_facts(cfg: AgentConfig, trained_round: int, with_learner: bool) -> ModelFacts:
    """Run the facts child for ``cfg`` and wait for its answer (at most ``FACTS_TIMEOUT_S``)."""
    child = FactsChild(cfg, trained_round, with_learner)
    if (facts := child.result(timeout=FACTS_TIMEOUT_S)) is None:
        child.stop()
        raise RuntimeError(f"the model facts process gave no answer within {FACTS_TIMEOUT_S:g} s")
    return facts


def learner_facts(cfg: AgentConfig, trained_round: int) -> LearnerFacts:
    """The facts of ``cfg``'s learner on the gateway's table, restored from the state folder."""
    from edge_agent.learners import make_learner
    from edge_agent.live import gateway_table
    from edge_agent.protocol import PLACEHOLDER_DIGEST, UpdateHeader, encode
    from edge_agent.state import AgentState
    from edge_agent.tensors import l2_norm

    table = gateway_table(cfg)
    learner = make_learner(cfg, table)
    fresh = l2_norm(learner.global_part(learner.wire_state(0)))
    AgentState(cfg.state_dir).restore(learner)
    wire = learner.wire_state(trained_round)
    shared = learner.global_part(wire)
    header = UpdateHeader(fleet=cfg.fleet, sender=cfg.client_id, round=1, n_samples=1, global_sha256=PLACEHOLDER_DIGEST)
    return LearnerFacts(signature=learner.signature, layout=_specs(shared), norm=l2_norm(shared), fresh_norm=fresh,
                        n_features=learner.n_features, n_samples=learner.n_samples,
                        latitude=table.latitude, longitude=table.longitude, notes=table.notes,
                        update_bytes=len(encode(header, wire)))


def fleet_facts(cfg: AgentConfig) -> FleetFacts | None:
    """The facts of the fleet's initial model in head mode (None in the other modes)."""
    from edge_agent.learners import HeadLearner, fleet_template
    from edge_agent.tensors import l2_norm

    if cfg.mode != HeadLearner.kind:
        return None
    template = fleet_template(cfg, cfg.seed)
    return FleetFacts(signature=template.signature, layout=_specs(template.initial), norm=l2_norm(template.initial))


def facts_of(job: FactsJob) -> ModelFacts:
    """The learner's facts ``job`` asks for; without them (not asked, or the data's reason there
    are none) the fleet's, which a gateway that cannot train yet checks global states by."""
    if not job.with_learner:
        return ModelFacts(fleet=fleet_facts(job.config))
    try:
        return ModelFacts(learner=learner_facts(job.config, job.trained_round))
    except ValueError as err:
        return ModelFacts(fleet=fleet_facts(job.config), problem=str(err),
                          problem_kind="data" if isinstance(err, DataError) else "value")


def main(job_path: Path) -> None:
    """The child: compute the facts and write them next to the job, with the peak memory it took."""
    from edge_agent.round_data import peak_rss_mb

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    facts = facts_of(FactsJob.model_validate_json(job_path.read_bytes()))
    answer = facts.model_copy(update={"peak_rss_mb": round(peak_rss_mb(), 1)})
    write_bytes_atomically(job_path.parent / ANSWER_FILE, answer.model_dump_json().encode())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
