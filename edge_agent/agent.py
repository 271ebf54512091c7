"""The edge agent daemon: local data, local training for each announced round, only what the
learner puts on the wire goes out. Its state survives restarts (``AgentState``).

No round can stop it. A global model that fails the checks (model signature, tensor layout,
finite values, an L2 norm at most ``max_global_growth`` times the last accepted one's) is
refused: logged, not installed, and the round is trained from the last good global state. A
round whose local training gives a non-finite loss or parameters is skipped: logged, the model
restored from the state folder as of the last good round, the round marked done and no update
sent (the coordinator treats the client as missing, as it does a silent one). Any other
exception while handling one message is logged and the agent goes on, so a poisoned round the
broker retains does not make it crash-loop.

Training runs in a child process (``edge_agent.training_child``): while it trains, the loop goes
on answering the coordinator's replies, its own presence and the forecasts; round and personal
messages wait until the round's result is in. The agent never loads torch: what it must know of
its learner comes from a child too (``edge_agent.model_facts``), it checks and stores global
states as numpy arrays, and the served bundle's export and a personal message's installation
are jobs of the round's child."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable

from edge_agent.config import AgentConfig, signed_settings
from edge_agent.data.errors import DataError
from edge_agent.live import LiveHistory
from edge_agent.model_facts import (
    FactsChild, FleetFacts, LearnerFacts, ModelFacts, model_facts, raise_problem, spec_layout,
)
from edge_agent.mqtt import Connection
from edge_agent.protocol import (
    HelloHeader,
    PersonalHeader,
    ProtocolError,
    ReplyHeader,
    RoundHeader,
    check_tensors,
    decode,
)
from edge_agent.round_data import MODE as HEAD_MODE
from edge_agent.serving.renewal import BundleRenewal
from edge_agent.protocol_client import ProtocolClient, settles_upload
from edge_agent.refusals import RETRY, Refused, RefusalBackoff
from edge_agent.state import AgentState
from edge_agent.storage import writable_folder
from edge_agent.tensors import Layout, TensorDict, first_non_finite, l2_norm, tensors_to_bytes
from edge_agent.topics import Topics
from edge_agent.training_child import RoundJob, TrainingChild, TrainingOutcome
from edge_agent.transport import Incoming, Transport

log = logging.getLogger("edgefl.agent")
UPDATE_HEADER_MARGIN = 4096  # room for metrics and the campaign id in a real update's header
HISTORY_POLL_S = 5.0  # a live gateway without enough history checks its store this often
FILE_HISTORY = 0  # the rows _history_rows gives a csv or a bundled site: not counted by the agent


def agent_subscriptions(cfg: AgentConfig) -> list[str]:
    """What an agent's session subscribes to: the round, its own task topic, the coordinator's status."""
    topics = Topics(cfg.fleet)
    return [topics.round, topics.agent(cfg.client_id, "task"), topics.coordinator_status]


class Agent:
    """One gateway's training service."""

    def __init__(self, cfg: AgentConfig, on_event: Callable[[str, dict], None] | None = None,
                 write_bundle: str | None = None, transport: Transport | None = None):
        """``write_bundle``: the ``module:function`` a live gateway with ``[serving]`` exports the
        model it serves with, in the round's child (``export.bundle:write_bundle``, named by
        ``edgefl agent run``); without it nothing is served. ``transport``: the broker session (the
        MQTT ``Connection`` to ``cfg.broker`` if None)."""
        self.cfg = cfg
        self.topics = Topics(cfg.fleet)
        self.files = AgentState(writable_folder(cfg.state_dir, "state_dir"))
        self.trained_round = self.files.trained_round()
        self.live = LiveHistory(cfg) if cfg.data.source == "sensors" else None
        self.facts: LearnerFacts | None = None  # the learner's, once the gateway's history can train one
        self.fleet: FleetFacts | None = None  # the fleet's initial model's (head mode)
        self._tried_rows: int | None = None  # the rows of the last history no learner could be built on
        self.adopting: tuple[int, FactsChild] | None = None  # a grown history's rows, its facts on the way
        self._adopt_first(self._history_rows())
        self.serving = BundleRenewal(self.live, write_bundle) if self.live and cfg.serving and write_bundle else None
        self.on_event = on_event or (lambda kind, data: None)
        self.finished = False
        self.training: TrainingChild | None = None
        self.waiting_messages: list[Incoming] = []  # round and personal messages that came while training
        self.transport = transport if transport is not None else Connection(
            cfg.broker, client_id=f"edgefl-agent-{cfg.fleet}-{cfg.client_id}",
            will_topic=self.topics.agent(cfg.client_id, "status"), subscriptions=agent_subscriptions(cfg),
        )
        self.client = ProtocolClient(self.transport, self.topics, cfg.client_id,
                                     RefusalBackoff(cfg.client_id, give_up_after_s=cfg.give_up_after_s),
                                     self._hello, self._unanswered)

    def _history_rows(self) -> int | None:
        """The rows of a live gateway's history, None while too short to train on; a file's or a
        bundled site's are not counted here (0): the child loads it and says what is wrong with it.
        The agent never holds the table (pandas stays in the children)."""
        return self.live.rows() if self.live else FILE_HISTORY

    def _adopt_first(self, rows: int | None) -> None:
        """At start, waiting for the child (``edge_agent.model_facts``): the facts of the learner built
        on the gateway's history with its saved state; without a history to train on, the fleet's
        (head mode)."""
        if rows is not None or self.cfg.mode == HEAD_MODE:
            self._take_facts(rows, model_facts(self.cfg, self.trained_round, with_learner=rows is not None))

    def _take_facts(self, rows: int | None, answer: ModelFacts) -> bool:
        """Train on the history of ``rows`` rows from now on, by ``answer``'s facts. A live history a
        learner cannot train on yet (too gappy for a window) is logged, tried again once it has more
        rows, and the agent keeps what it had; any other source's problem stops the agent. True
        when adopted."""
        self.fleet = answer.fleet or self.fleet
        if rows is None:
            return False
        try:
            raise_problem(answer)
        except DataError as err:
            if self.live is None:
                raise
            self.live.waiting("history not trainable yet", str(err))
            self._tried_rows = rows
            return False
        self._check_update_size(answer.learner.update_bytes)
        self.facts = answer.learner
        self.layout, self.global_norm = spec_layout(answer.learner.layout), answer.learner.norm
        return True

    def _watch_history(self) -> None:
        """A live gateway that cannot train yet: once its history has grown, a child finds out in the
        background whether a learner can be built on it now; once one can, register."""
        if self.adopting is None:
            rows = self._history_rows()
            if rows is not None and rows != self._tried_rows:
                self.adopting = rows, FactsChild(self.cfg, self.trained_round, with_learner=True)
            return
        rows, child = self.adopting
        if (answer := child.result()) is None:
            return
        self.adopting = None
        if self._take_facts(rows, answer):
            self.client.want(resend=True)

    def _check_update_size(self, update_bytes: int) -> None:
        """An update over ``max_payload_bytes`` (the broker's ``max_packet_size``, less the MQTT
        headers) would be refused by the broker and re-sent after every reconnect, forever: refuse
        to start (``update_bytes``: the envelope of an update with a bare header)."""
        size = update_bytes + UPDATE_HEADER_MARGIN
        if size > self.cfg.max_payload_bytes:
            raise ValueError(f"max_payload_bytes: this model's updates take about {size} bytes, over the limit of "
                             f"{self.cfg.max_payload_bytes}; raise it for the broker, the coordinator and every "
                             "agent (edgefl broker-config --max-payload-bytes), or use a smaller model")

    # lifecycle -------------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Serve rounds until the coordinator announces the end (or ``stop`` says so); a live
        gateway that serves forecasts goes on serving them and joins the next campaign."""
        if self.live:
            self.live.start()
        self.transport.start()
        why, polled = "an error (traceback follows)", time.monotonic()
        try:
            while not (self.finished and self.serving is None) and not stop():
                if self.facts is None and time.monotonic() - polled > HISTORY_POLL_S:
                    self._watch_history()
                    polled = time.monotonic()
                if self.serving is not None and self.serving.tick():
                    self.on_event("forecast", {"round": self.trained_round})
                self.client.tick()
                if self.training is not None:
                    self.finish_training()
                try:
                    message = self.transport.inbox.get(timeout=0.1)
                except queue.Empty:
                    continue
                self.receive(message)
            why = f"campaign {self.files.campaign} finished" if self.finished else "asked to stop"
        except Refused:
            why = "refused by the coordinator (see above)"
            raise
        finally:
            log.info("%s exits: %s", self.cfg.client_id, why)
            for child in (self.training, self.adopting and self.adopting[1]):
                if child:
                    child.stop()
            self.client.goodbye()
            if self.live:
                self.live.stop()

    def _hello(self) -> HelloHeader | None:
        """Our registration: none while there is not enough history for a learner (the fleet must
        not wait for this gateway)."""
        if self.facts is None:
            return None
        return HelloHeader(
            fleet=self.cfg.fleet, sender=self.cfg.client_id, n_features=self.facts.n_features,
            n_samples=self.facts.n_samples, latitude=self.facts.latitude, longitude=self.facts.longitude,
            model_signature=self.facts.signature, model_settings=signed_settings(self.cfg),
        )

    def _unanswered(self) -> list[bytes]:
        """The update still waiting for the coordinator's answer, if any (and a learner sent it)."""
        return [self.files.pending.read_bytes()] if self.facts is not None and self.files.pending.is_file() else []

    def receive(self, message: Incoming) -> None:
        """Handle one message as the loop does (tests deliver them here): whatever fails is logged
        and the agent goes on."""
        try:
            self._handle(message)
        except Refused:
            raise  # the coordinator keeps refusing us for a reason only an operator can fix: exit
        except Exception:  # the guard's purpose: no message may stop the agent
            log.exception("failed on a message on %s; going on", message.topic)
            self.on_event("error", {"topic": message.topic})

    def _handle(self, message: Incoming) -> None:
        if message.topic == self.topics.coordinator_status:
            self.client.coordinator_status(message.payload)
            return
        if message.topic == self.topics.round and not message.payload:
            log.info("the coordinator cleared the round left by an earlier campaign: waiting for its announcement")
            return
        try:
            header, tensors = decode(message.payload, self.cfg.max_payload_bytes, framework="np")
        except ProtocolError as err:
            log.warning("ignoring a bad message on %s: %s", message.topic, err)
            return
        if self._stale(header):
            log.info("ignoring a %s of campaign %s: ours is %s", header.kind, header.campaign, self.files.campaign)
        elif self.training is not None and isinstance(header, (RoundHeader, PersonalHeader)):
            self.waiting_messages.append(message)  # handled once the round in training is done
        elif isinstance(header, RoundHeader):
            self._on_round(header, tensors)
        elif isinstance(header, ReplyHeader):
            self._on_reply(header)
        elif isinstance(header, PersonalHeader):
            self._on_personal(header, tensors)

    def _on_round(self, header: RoundHeader, global_state: TensorDict) -> None:
        if self.facts is None:
            log.info("round %d: no model yet (waiting for sensor history)%s", header.round,
                     self._keep_fleet_model(header, global_state))
            return
        if not self._in_campaign(header):
            return
        problem = self._global_problem(header, global_state, self.facts.signature, self.layout, self.global_norm,
                                       "the last accepted one's")
        export = problem is None and self.serving is not None and self.cfg.mode == HEAD_MODE
        if problem is None:
            self.files.save_global(global_state)
            self.global_norm = l2_norm(global_state)
        else:
            log.error("round %d: refusing the global model (%s); keeping the last good one", header.round, problem)
            self.on_event("global_refused", {"round": header.round, "reason": problem})
        train = self._should_train(header)
        if export or train:
            self._start_child(RoundJob(config=self.cfg, round=header.round, announced=header.body_sha256,
                                       task="train" if train else "export",
                                       export_round=self.trained_round + 1 if export else None,
                                       bundle_writer=self.serving.writer if export else ""))
        if header.finished:
            going_on = "; serving forecasts and waiting for the next campaign" if self.serving is not None else ""
            log.info("campaign %s finished with round %d%s", header.campaign, header.round, going_on)
            self.finished = True
            self.on_event("finished", {"round": header.round})

    def _should_train(self, header: RoundHeader) -> bool:
        """Whether to train the announced round (said when not: asked or refused)."""
        if header.finished:
            return False
        if not header.asks(self.cfg.client_id):
            log.info("round %d: not asked to train (%d of the fleet are)", header.round, header.asked_count)
            self.on_event("not_asked", {"round": header.round})
            return False
        if self.client.backoff.shut_out:
            log.warning("round %d: not training, the coordinator refused us (%s)", header.round,
                        self.client.backoff.terminal[-1])
            return False
        return header.round > self.trained_round

    def _stale(self, header) -> bool:
        """A reply or personal message of another campaign (queued in our broker session since
        then): it must not touch this campaign's state. A fresh agent still takes replies."""
        if isinstance(header, PersonalHeader):
            return header.campaign != self.files.campaign
        return isinstance(header, ReplyHeader) and self.files.campaign not in (None, header.campaign)

    def _in_campaign(self, header: RoundHeader) -> bool:
        """Whether ``header`` is of the campaign this agent takes part in. A running campaign
        that is not ours is joined (state of an older one is dropped first); a finished one we
        took no part in is left alone: its retained end is no reason to exit."""
        if header.campaign == self.files.campaign:
            return True
        if header.finished:
            log.info("round %d of campaign %s is its end and this agent (campaign %s) took no part in it: "
                     "waiting for a new campaign", header.round, header.campaign, self.files.campaign)
            self.on_event("waiting", {"campaign": header.campaign})
            return False
        if self.files.campaign is not None or self.trained_round:
            log.warning("state of campaign %s (round %d) dropped: starting over for campaign %s",
                        self.files.campaign, self.trained_round, header.campaign)
            self.trained_round, self.global_norm = 0, self.facts.fresh_norm
        self.files.join(header.campaign)
        self.finished = False
        self.on_event("joined", {"campaign": header.campaign})
        return True

    def _keep_fleet_model(self, header: RoundHeader, state: TensorDict) -> str:
        """A head-mode gateway that cannot train yet keeps the fleet's global state, so what it
        serves meanwhile may be the fleet's model (``edge_agent.newcomer``); said in the log line.
        Checked as an installed one is (signature, layout, finite values, norm against the initial
        model's); the campaign is joined later, with the learner."""
        if self.cfg.mode != HEAD_MODE or self.fleet is None:
            return ""
        problem = self._global_problem(header, state, self.fleet.signature, spec_layout(self.fleet.layout),
                                       self.fleet.norm, "the initial model's")
        if problem is not None:
            log.error("round %d: refusing the global model (%s)", header.round, problem)
            return ""
        self.files.save_global(state)
        return "; kept the fleet's model to forecast with meanwhile"

    def _global_problem(self, header: RoundHeader, state: TensorDict, signature: str, layout: Layout,
                        reference_norm: float, reference: str) -> str | None:
        """Why a round's global model must not be installed, or None when it may: its signature,
        layout, finite values and a norm at most ``max_global_growth`` x ``reference_norm`` (the
        last accepted one's; the fleet's initial model's for a gateway without a learner)."""
        if header.model_signature != signature:
            return f"another model (signature {header.model_signature}, ours {signature})"
        try:
            check_tensors(state, layout)
        except ProtocolError as err:
            return str(err)
        norm, limit = l2_norm(state), self.cfg.max_global_growth * max(reference_norm, 1.0)
        if not norm <= limit:
            return f"its norm {norm:.3g} exceeds {self.cfg.max_global_growth:g} x {reference}"
        return None

    def _start_child(self, job: RoundJob, personal: bytes = b"") -> None:
        """Start ``job`` in a child process; a training job on the latest history, its update bound
        to the round's announcement (``job.announced``: its body_sha256, which the coordinator
        checks) and published when the child is done (``finish_training``)."""
        if job.task == "train":
            job = job.model_copy(update={"metrics": self.live.metrics() if self.live else {}})
        self.training = TrainingChild(job, personal)

    def finish_training(self, timeout: float = 0.0) -> bool:
        """Once the round's child is done (waiting up to ``timeout`` s): serve the bundle it exported,
        publish its update or skip a failed round, or take its answer to a personal message; then
        handle the messages that waited. True when it was done."""
        result = self.training.result(timeout)
        if self.training.take_new_bundle() and self.serving is not None:
            self.serving.renewed()
        if result is None:
            return False
        task, self.training = self.training.job.task, None
        if task == "personal":
            self._personal_done(result)
        elif task == "train" and result.status == "sent":
            self._send_trained(result)
        elif task == "train":
            self._skip_failed_round(result)
        waiting, self.waiting_messages = self.waiting_messages, []
        for message in waiting:
            self.receive(message)
        return True

    def _send_trained(self, result: TrainingOutcome) -> None:
        """The child saved the round's personal state and update: publish it, registering again
        first when the history it trained on holds another sample count (the coordinator weighs the
        gateway by what it holds)."""
        self.trained_round = result.round
        log.info("round %d: trained in %.1f s (training process peak %.0f MB, data process peak %.0f MB)",
                 result.round, result.seconds, result.peak_rss_mb, result.data_peak_rss_mb)
        if result.n_samples is not None and result.n_samples != self.facts.n_samples:
            self.facts = self.facts.model_copy(update={"n_samples": result.n_samples})
            self.client.introduce(resend=False)
        self.client.send("update", self.files.pending.read_bytes())
        self.on_event("sent", {"round": result.round, "loss": result.loss, "peak_rss_mb": result.peak_rss_mb})

    def _skip_failed_round(self, result: TrainingOutcome) -> None:
        log.error("round %d: %s; no update sent, model restored as of the last good round", result.round,
                  result.reason)
        self.files.mark_trained(result.round)
        self.trained_round = result.round
        self.on_event("failed", {"round": result.round, "loss": result.loss, "reason": result.reason})

    def _on_personal(self, header: PersonalHeader, tensors: TensorDict) -> None:
        """The round's strategy sent this client its own tensors (FedPoD: personalized prompts);
        non-finite ones are refused like a non-finite global model, and one of a round other than
        the one this agent trained last (re-sent by a restarted coordinator) is stale. The learner
        installs it in a child process (``finish_training`` takes its answer)."""
        if header.round != self.trained_round:
            log.info("ignoring the personal message of round %d: our last trained round is %d", header.round,
                     self.trained_round)
            return
        if (bad := first_non_finite(tensors)) is not None:
            log.warning("ignoring the personal message of round %d: %s holds NaN or inf values", header.round, bad)
            return
        self._start_child(RoundJob(config=self.cfg, round=header.round, task="personal"), tensors_to_bytes(tensors))

    def _personal_done(self, result: TrainingOutcome) -> None:
        """The child installed the personal message and saved the personal state, or refused it."""
        if result.status == "failed":
            log.warning("ignoring the personal message of round %d: %s", result.round, result.reason)
            return
        self.on_event("personal", {"round": result.round})

    def _on_reply(self, reply: ReplyHeader) -> None:
        """Answers to our hello and updates; a refusal goes to the backoff, which schedules the
        next introduction (or gives up: ``Refused``)."""
        self.on_event("reply", reply.model_dump())
        self.client.answered(reply)
        if settles_upload(reply):
            self.files.pending.unlink(missing_ok=True)
        if reply.about == "update" and not reply.accepted and reply.code not in RETRY:
            log.warning("update refused: %s", reply.reason)
