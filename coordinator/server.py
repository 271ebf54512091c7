"""The coordinator service: rounds over MQTT, durable state, validation of everything received.

Round state machine: announce round r (retained, global shared parameters as body) -> collect
updates until every online client has sent one (and at least ``min_clients``) or the deadline
passes with a quorum -> impute the registered clients that did not report from their digital
twins (FedDTW; ``twin = "drop"`` leaves them out) -> aggregate -> persist (one transaction) ->
announce r + 1. An update for a closed round is kept as late: twin history only. Every message
is acknowledged to the broker only after its effect is on disk, so after ``kill -9`` the broker
redelivers what was not yet stored and the store already holds what was. Messages that
arrive together are validated and committed as one batch (group commit: one folder sync and
one SQLite commit), then answered and acknowledged.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from coordinator.engine import RoundEngine, RoundResult
from coordinator.store import RoundRow, Store
from coordinator.strategies import ClientInfo, ClientUpdate, StrategySettings, make_strategy
from coordinator.twins import TwinSettings
from edge_agent.config import FleetModel
from edge_agent.learners import fleet_template
from edge_agent.mqtt import BrokerConfig, Connection, Incoming
from edge_agent.protocol import (
    NAME_PATTERN,
    HelloHeader,
    PersonalHeader,
    ProtocolError,
    ReplyHeader,
    RoundHeader,
    Topics,
    UpdateHeader,
    check_tensors,
    claimed_round,
    decode,
    encode,
)
from edge_agent.tensors import TensorDict, layout_of

log = logging.getLogger("edgefl.coordinator")
SENDER = "coordinator"


class CoordinatorConfig(FleetModel, TwinSettings, StrategySettings):
    """``coordinator.toml``: the fleet, the rounds, the model, the strategy and the broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str = Field(pattern=NAME_PATTERN)
    state_dir: Path
    rounds: int = Field(10, ge=1)
    min_clients: int = Field(1, ge=1, description="quorum: updates needed to close a round")
    start_clients: int = Field(0, ge=0, description="hold round 1 until this many clients have registered")
    round_timeout_s: float = Field(300.0, gt=0, description="deadline of a round after its announcement")
    max_payload_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    registration: Literal["open", "closed"] = "open"
    allowed_clients: list[str] = Field(default_factory=list)
    seed: int = 42
    broker: BrokerConfig = BrokerConfig()

    @model_validator(mode="before")
    @classmethod
    def _prompt_mode_runs_fedpod(cls, data: object) -> object:
        """Prompt mode aggregates with FedPoD unless a strategy is named."""
        if isinstance(data, dict) and data.get("mode") == "prompt" and "strategy" not in data:
            return {**data, "strategy": "fedpod"}
        return data

    @model_validator(mode="after")
    def _check(self) -> "CoordinatorConfig":
        if self.strategy == "fedpod" and self.mode != "prompt":
            raise ValueError("strategy 'fedpod' personalizes prompts: it needs mode = 'prompt'")
        if self.registration == "closed" and not self.allowed_clients:
            raise ValueError("registration is closed but allowed_clients is empty")
        if self.registration == "closed" and self.start_clients > len(self.allowed_clients):
            raise ValueError(f"start_clients: {self.start_clients} can never register; "
                             f"allowed_clients lists {len(self.allowed_clients)}")
        return self


class Coordinator:
    """Runs the rounds of one fleet until the last one is aggregated."""

    def __init__(self, cfg: CoordinatorConfig, on_event: Callable[[str, dict], None] | None = None):
        self.cfg = cfg
        self.topics = Topics(cfg.fleet)
        self.store = Store(cfg.state_dir)
        template = fleet_template(cfg, cfg.seed)
        self.initial, self.signature, self.layout = template.initial, template.signature, layout_of(template.initial)
        self.strategy = make_strategy(cfg, template.initial, cfg.seed)
        self.engine = RoundEngine(self.strategy, cfg, self.store.dir / "twins", robust=cfg.robust)
        self.on_event = on_event or (lambda kind, data: None)
        self.connection = Connection(
            cfg.broker,
            client_id=f"edgefl-coordinator-{cfg.fleet}",
            will_topic=self.topics.coordinator_status,
            subscriptions=[self.topics.agents(leaf) for leaf in ("hello", "update", "status")],
            manual_ack=True,
        )
        self.connection.on_connected.append(self._announce_presence)
        self._decoded: dict[tuple[int, str], dict] = {}  # this round's accepted tensors, kept for aggregation
        self._replies: list[tuple[str, bytes]] = []

    # lifecycle -------------------------------------------------------------------------------

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Resume or start the rounds and process messages until the last round is aggregated."""
        current = self._resume()
        self.connection.start()
        if not self.connection.connected.wait(30):
            raise ConnectionError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port}")
        try:
            current = self._await_fleet(current, stop)
            if stop():
                return
            closed = current.round if current.closed_at is not None else current.round - 1
            self._send_personal(closed, self.store.personal_messages(closed))  # again after a restart
            self._announce(current)
            while current.closed_at is None and not stop():
                batch = self._drain()
                if batch:
                    self._process(batch)
                current = self._maybe_close(current)
        finally:
            self.connection.stop(self.topics.coordinator_status)
            self.store.close()

    def _resume(self) -> RoundRow:
        """The open round (round 1 on a fresh start), with the strategy's state as of the last close."""
        latest = self.store.latest_round()
        if latest is not None:
            closed = latest.round if latest.closed_at is not None else latest.round - 1
            saved = self.store.strategy_state(closed)
            if saved is not None:
                self.strategy.load_state_dict(saved)
        if latest is None:
            latest = self.store.open_first_round(time.time() + self.cfg.round_timeout_s, self.initial)
            log.info("fleet %s: opened round 1", self.cfg.fleet)
        elif latest.closed_at is None:
            accepted = [u.client_id for u in self.store.updates(latest.round)]
            log.info("resuming round %d with %d accepted updates %s", latest.round, len(accepted), accepted)
            self.on_event("resumed", {"round": latest.round, "accepted": accepted})
        return latest

    def _await_fleet(self, row: RoundRow, stop: Callable[[], bool]) -> RoundRow:
        """Hold a fresh round 1 until ``start_clients`` have registered, so the first round is
        not closed by whoever came up first; its deadline then starts from the announcement."""
        if row.round != 1 or self.store.updates(1) or len(self.store.clients()) >= self.cfg.start_clients:
            return row
        shown = -1
        while (registered := len(self.store.clients())) < self.cfg.start_clients and not stop():
            if registered != shown:
                log.info("waiting for the fleet: %d/%d clients registered", registered, self.cfg.start_clients)
                self.on_event("waiting", {"registered": registered, "needed": self.cfg.start_clients})
                shown = registered
            batch = self._drain()
            if batch:
                self._process(batch)
        self.store.extend_deadline(1, time.time() + self.cfg.round_timeout_s)
        return self.store.round(1)

    def _announce_presence(self) -> None:
        self.connection.publish(self.topics.coordinator_status, b"online", retain=True)

    def _announce(self, row: RoundRow) -> None:
        """Publish the round (retained) so agents that join late get it too."""
        finished = row.closed_at is not None
        state = self.store.load_file(row.result_file if finished else row.global_file)
        header = RoundHeader(
            fleet=self.cfg.fleet, sender=SENDER, round=row.round, deadline_unix=row.deadline,
            model_signature=self.signature, finished=finished,
        )
        self.connection.publish(self.topics.round, encode(header, state), retain=True)
        self.on_event("announced", {"round": row.round, "finished": finished})

    # rounds ----------------------------------------------------------------------------------

    def _maybe_close(self, row: RoundRow) -> RoundRow:
        updates = self.store.updates(row.round)
        online = {c for c, info in self.store.clients().items() if info.online}
        submitted = {u.client_id for u in updates}
        quorum = len(updates) >= self.cfg.min_clients
        if quorum and online <= submitted:
            return self._close(row, updates, "all online clients reported")
        if time.time() < row.deadline:
            return row
        if quorum:
            return self._close(row, updates, "deadline")
        deadline = time.time() + self.cfg.round_timeout_s
        self.store.extend_deadline(row.round, deadline)
        log.warning("round %d: deadline passed with %d/%d updates; waiting until %.0f",
                    row.round, len(updates), self.cfg.min_clients, deadline)
        return self.store.round(row.round)

    def _close(self, row: RoundRow, updates: list, why: str) -> RoundRow:
        """Run the round engine, make its result durable, then send personal messages and the
        next announcement."""
        on_time = [
            ClientUpdate(u.client_id, self._decoded.pop((row.round, u.client_id), None) or self.store.load_update(u),
                         u.n_samples, u.metrics)
            for u in updates
        ]
        self._decoded.clear()
        roster = [ClientInfo(c.client_id, c.n_samples, c.latitude, c.longitude) for c in self.store.clients().values()]
        result = self.engine.close(row.round, self.store.load_file(row.global_file), on_time, roster)
        self.store.save_strategy_state(row.round, self.strategy.state_dict())
        for client, tensors in result.personal.items():
            self.store.save_personal(row.round, client, tensors)
        metrics = {"clients": list(result.on_time), "imputed": list(result.imputed), "dropped": list(result.dropped),
                   "twin": result.twin, "loss": result.loss, "closed_by": why, "rejected": result.rejected,
                   "clipped": list(result.clipped), **result.metrics}
        last = row.round >= self.cfg.rounds
        self.store.finish_round(row.round, metrics, result.global_state,
                                None if last else time.time() + self.cfg.round_timeout_s)
        for client, code in result.rejected.items():
            self.store.log("update", client, row.round, False, code, "left out of the round by the engine's screening")
            self.on_event("rejected", {"client": client, "code": code, "reason": "screening"})
        self._report_close(row.round, result, why)
        self._send_personal(row.round, result.personal)
        following = self.store.round(row.round if last else row.round + 1)
        self._announce(following)
        return following

    def _report_close(self, number: int, result: RoundResult, why: str) -> None:
        rejected = sum(1 for e in self.store.events(accepted=False) if e["round"] == number)
        self.on_event("closed", {"round": number, "accepted": len(result.on_time), "rejected": rejected,
                                 "imputed": list(result.imputed), "loss": result.loss, "why": why})
        log.info("round %d closed (%s): %d updates, %d imputed by %s, loss %.4f", number, why, len(result.on_time),
                 len(result.imputed), result.twin, result.loss)

    def _send_personal(self, number: int, messages: dict[str, TensorDict]) -> None:
        """Each client's own tensors of round ``number`` (FedPoD: personalized prompts) on its task
        topic (QoS 1), before the next round's announcement."""
        for client, tensors in messages.items():
            header = PersonalHeader(fleet=self.cfg.fleet, sender=SENDER, round=number)
            self.connection.publish(self.topics.agent(client, "task"), encode(header, tensors))

    # messages --------------------------------------------------------------------------------

    def _drain(self, limit: int = 256) -> list[Incoming]:
        """Wait briefly for one message, then take whatever else is already queued."""
        try:
            batch = [self.connection.inbox.get(timeout=0.05)]
        except queue.Empty:
            return []
        while len(batch) < limit:
            try:
                batch.append(self.connection.inbox.get_nowait())
            except queue.Empty:
                break
        return batch

    def _process(self, batch: list[Incoming]) -> None:
        """Validate and persist a batch in one transaction; only then reply and acknowledge."""
        self._replies = []
        with self.store.batch():
            for message in batch:
                self._handle(message)
        for topic, payload in self._replies:
            self.connection.publish(topic, payload)
        for message in batch:
            self.connection.ack(message)

    def _handle(self, message: Incoming) -> None:
        client = self.topics.client_of(message.topic)
        leaf = message.topic.rsplit("/", 1)[-1]
        if client is None:
            return
        if leaf == "status":
            self._on_status(client, message.payload)
        elif leaf in ("hello", "update"):
            self._on_envelope(client, leaf, message.payload)

    def _on_status(self, client: str, payload: bytes) -> None:
        if payload not in (b"online", b"offline") or client not in self.store.clients():
            return
        self.store.set_online(client, payload == b"online")
        self.on_event("presence", {"client": client, "online": payload == b"online"})

    def _on_envelope(self, client: str, leaf: str, payload: bytes) -> None:
        current = self.store.latest_round()
        try:
            header, tensors = decode(payload, self.cfg.max_payload_bytes)
            self._check_sender(client, leaf, header)
            if isinstance(header, HelloHeader):
                self._register(header)
            else:
                self._accept_update(header, tensors, payload[len(payload) - header.body_bytes :], current)
        except ProtocolError as err:
            number = claimed_round(payload)
            self.store.log(leaf, client, current.round, False, err.code, str(err))
            self._reply(client, leaf, number, False, err.code, str(err))
            self.on_event("rejected", {"client": client, "code": err.code, "reason": str(err)})

    def _check_sender(self, client: str, leaf: str, header) -> None:
        if header.kind != leaf:
            raise ProtocolError("wrong_kind", f"a {header.kind!r} message on an {leaf!r} topic")
        if header.fleet != self.cfg.fleet:
            raise ProtocolError("wrong_fleet", f"message for fleet {header.fleet!r}, this is {self.cfg.fleet!r}")
        if header.sender != client:
            raise ProtocolError("wrong_sender", f"sender {header.sender!r} does not match topic client {client!r}")

    def _register(self, hello: HelloHeader) -> None:
        if self.cfg.registration == "closed" and hello.sender not in self.cfg.allowed_clients:
            raise ProtocolError("unknown_client", f"{hello.sender!r} is not in allowed_clients")
        if hello.model_signature != self.signature:
            raise ProtocolError("bad_signature", "the agent's model differs from the coordinator's")
        self.store.register(hello)
        self.store.log("hello", hello.sender, None, True)
        self._reply(hello.sender, "hello", 0, True)
        self.on_event("registered", {"client": hello.sender})

    def _accept_update(self, header: UpdateHeader, tensors: dict, body: bytes, current: RoundRow) -> None:
        client = header.sender
        if client not in self.store.clients():
            raise ProtocolError("unknown_client", f"{client!r} has not registered (send hello first)")
        if header.round > current.round:
            raise ProtocolError("future_round", f"round {header.round} has not started; current is {current.round}")
        if self.store.has_update(header.round, client):
            raise ProtocolError("duplicate", f"round {header.round} already has an update from {client!r}")
        check_tensors(tensors, self.layout)
        late = header.round < current.round or current.closed_at is not None
        self.store.save_update(
            header.round, client, header.n_samples, body, header.body_sha256, header.metrics, late=late
        )
        if late:
            self.engine.observe_late(client, header.round, tensors)
            self.store.log("update", client, header.round, True, "late", "the round had closed: twin history only")
            self._reply(client, "update", header.round, True, "late", "the round had closed: kept as twin history")
            self.on_event("late", {"client": client, "round": header.round})
            return
        self._decoded[current.round, client] = tensors
        self.store.log("update", client, current.round, True)
        self._reply(client, "update", current.round, True)
        self.on_event("accepted", {"client": client, "round": current.round})

    def _reply(
        self, client: str, about: str, number: int, accepted: bool, code: str = "", reason: str = ""
    ) -> None:
        """Queue an answer for the agent's own task topic (sent once the batch is durable);
        ``number`` is the round the message was about."""
        header = ReplyHeader(
            fleet=self.cfg.fleet, sender=SENDER, round=number, accepted=accepted, about=about, code=code,
            reason=reason[:500],
        )
        self._replies.append((self.topics.agent(client, "task"), encode(header)))

