"""The coordinator service: rounds over MQTT, durable state, validation of everything received.

Round state machine: announce round r (retained, global shared parameters as body) -> collect
updates until every online client has sent one (and at least ``min_clients``) or the deadline
passes with a quorum (the round policy, ``coordinator.strategies.participation``; fewer than
``min_clients`` on-time updates left after the engine's screen: the round waits on) -> impute
the registered clients that did not report from their digital twins (FedDTW; ``twin = "drop"``
leaves them out) -> aggregate -> persist (one transaction) ->
announce r + 1. An update for a closed round is kept as late: twin history, and a stand-in for
its client at the next close (``coordinator.twins.late``). Every message
is acknowledged to the broker only after its effect is on disk, so after ``kill -9`` the broker
redelivers what was not yet stored and the store already holds what was. Messages that
arrive together are validated and committed as one batch (group commit: one database commit,
tensors included), then answered and acknowledged.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Protocol

from coordinator.access import Access
from coordinator.config import CoordinatorConfig
from coordinator.engine import RoundEngine, ClosedRound, TooFewScreened
from coordinator.intake import (
    STORAGE_ERRORS, Effects, Refusal, check_model, check_replay, check_sender, guarded, record, stale_round,
    with_retries,
)
from coordinator.lease import take_lead
from coordinator.observe.service import Observer
from coordinator.pretraining import write_foundation
from coordinator.store import RoundRow, Store
from coordinator.store_backends import LeaseLost
from coordinator.participants import Participants
from edge_agent.asked import announced
from coordinator.strategies import ClientInfo, ClientUpdate, RoundPolicy, make_strategy
from coordinator.strategies.trust import latest_trust
from coordinator.throttle import IntakeThrottle
from edge_agent.backoff import Backoff
from edge_agent.broker_settings import COORDINATOR_RECEIVE_WINDOW
from edge_agent.config import signed_settings
from edge_agent.learners import FleetTemplate, fleet_template
from edge_agent.mqtt import Connection
from edge_agent.protocol import (
    HelloHeader, PersonalHeader, ProtocolError, ReplyHeader, RoundHeader, UpdateHeader, body_digest,
    check_tensors, claimed_round, decode, encode,
)
from edge_agent.tensors import TensorDict
from edge_agent.topics import Topics
from edge_agent.transport import Incoming, Transport

log = logging.getLogger("edgefl.coordinator")
SENDER = "coordinator"
FINISHED_EXIT_CODE = 4  # `coordinator serve` on a state_dir whose campaign has ended
KEPT_DIGESTS = 16  # rounds whose announced global digest is kept in memory (recomputed from the store if needed)
class CampaignFinished(RuntimeError):
    """The state_dir holds a campaign whose last round is aggregated: nothing left to serve."""


def coordinator_connection(cfg: CoordinatorConfig, client_id: str, *extra_subscriptions: str) -> Connection:
    """A coordinator's broker session: every agent's hello/update/status and the round topic,
    acknowledged by hand once stored; plus ``extra_subscriptions`` (a site's uplink topics).
    Retained hellos and updates are not replayed to it (a device may leave them; only presence counts)."""
    topics = Topics(cfg.fleet)
    return Connection(
        cfg.broker, client_id=client_id, will_topic=topics.coordinator_status,
        subscriptions=coordinator_subscriptions(cfg, *extra_subscriptions),
        manual_ack=True, receive_maximum=COORDINATOR_RECEIVE_WINDOW,
        live_only=[topics.agents("hello"), topics.agents("update")],
    )


def coordinator_subscriptions(cfg: CoordinatorConfig, *extra: str) -> list[str]:
    """What a coordinator's session subscribes to: every agent's hello, update and status, the round topic."""
    topics = Topics(cfg.fleet)
    return [*(topics.agents(leaf) for leaf in ("hello", "update", "status")), topics.round, *extra]


class RoundOwner(Protocol):
    """Who owns a coordinator's rounds, as seen by the loop that takes its gateways' messages: the
    coordinator itself (the fleet's, the default) or a site aggregator (``coordinator.site``), whose
    rounds and campaign are the central coordinator's. Paho-style extension points, one per moment
    where the two differ."""

    def campaign_id(self) -> str:
        """The campaign the rounds belong to ("" until it is known)."""
        ...

    def announce(self, row: RoundRow) -> None:
        """Publish round ``row`` to the gateways (retained)."""
        ...

    def overtaken(self, row: RoundRow) -> str | None:
        """Why open round ``row`` can wait no longer (a site: the central round moved on), or None.
        Such a round closes at once with the updates that pass the screen, whatever the quorum."""
        ...

    def close_round(self, row: RoundRow, updates: list, why: str) -> RoundRow:
        """Aggregate round ``row`` from ``updates`` and move on; the round the gateways work on next."""
        ...

    def registered(self, hello: HelloHeader) -> Effects:
        """What a gateway's accepted registration sets off beyond its reply."""
        ...

    def route(self, message: Incoming) -> Effects | None:
        """The effects of a message that is not a gateway's (None: the gateways' loop takes it)."""
        ...


class Coordinator:
    """Runs the rounds of one fleet until the last one is aggregated; the owner of its own rounds
    (``RoundOwner``) unless it is given another."""

    def __init__(self, cfg: CoordinatorConfig, on_event: Callable[[str, dict], None] | None = None,
                 store: Store | None = None, config_path: Path | None = None, transport: Transport | None = None,
                 owner: Callable[[Coordinator], RoundOwner] | None = None,
                 on_close: Callable[[ClosedRound], None] | None = None, template: FleetTemplate | None = None):
        """``store``: as ``lease.take_lead`` gave it (taken here, waiting for the lease, if None);
        ``config_path``: the file ``cfg`` came from, whose allow-list is reloaded when it changes;
        ``transport``: the broker session (the MQTT ``Connection`` to ``cfg.broker`` if None);
        ``owner``: makes the owner of the rounds from this coordinator (None: it owns them);
        ``on_close``: given each round's result once it is durable (a simulation records its rounds);
        ``template``: the fleet's model (``fleet_template(cfg)`` if None; a simulation of a model
        no coordinator.toml describes, such as FedPoD's fine-tuning baselines, gives its own)."""
        self.cfg = cfg
        self.access = Access(cfg, config_path)
        self.topics = Topics(cfg.fleet)
        self.store = store or take_lead(cfg)
        self.clock = self.store.clock  # deadlines and records: wall time, or a simulation's clock
        template = template or fleet_template(cfg, cfg.seed)
        self.initial, self.signature = template.initial, template.signature
        self.settings = signed_settings(cfg)  # what the signature stands for: refusals name the differences
        self.update_layout = template.update_layout  # global state + what updates carry beyond it (core-sets)
        self.strategy = make_strategy(cfg, template.initial, cfg.seed)
        self.engine = RoundEngine(self.strategy, cfg, self.store.tensors, robust=cfg.robust,
                                  on_time=self.store.last_on_time(), state_keys=template.initial,
                                  trust=latest_trust(r.metrics for r in self.store.rounds() if r.closed_at is not None),
                                  buffer=cfg.participation.buffering)
        self.observer = Observer.for_coordinator(cfg)  # metrics; the dashboard with [http]
        self.on_event = self.observer.relay(on_event)
        self.on_close = on_close
        self.transport = transport if transport is not None else coordinator_connection(
            cfg, f"edgefl-coordinator-{cfg.fleet}")
        self.transport.on_connected.append(self._announce_presence)
        self._decoded: dict[tuple[int, str], dict] = {}  # this round's accepted tensors, kept for aggregation
        self._digests: dict[int, str] = {}  # round -> body_sha256 of its announced global state
        self.throttle = IntakeThrottle(cfg.intake)
        self._held: list[Incoming] = []  # a batch the store could not take, tried again on ``storage_retry``
        self.storage_retry = Backoff(base_s=0.5, cap_s=30.0)  # after a storage error (full disk, database gone)
        self.owner: RoundOwner = self if owner is None else owner(self)
        self.campaign = self.owner.campaign_id()
        self._announced: RoundRow | None = None  # the round on the broker as of our last announcement
        policy = RoundPolicy(cfg.participation, cfg.min_clients, cfg.seed)
        self.participants = Participants(policy, self.store, self.access, self.engine.held)

    def campaign_id(self) -> str:
        """This fleet's campaign id, made when its first round opens."""
        return self.store.campaign()

    # lifecycle -------------------------------------------------------------------------------

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Resume or start the rounds and process messages until the last round is aggregated.
        On a campaign that had already ended: announce its end again (a crash may have come
        before that announcement), wait for the goodbyes, then raise ``CampaignFinished``."""
        current, goodbye = self.resume(), self.topics.coordinator_status
        ended = current.closed_at is not None
        if ended:
            log.warning("campaign %s already finished with round %d: announcing its end again, then exiting",
                        self.campaign, current.round)
        self.transport.start()
        if not self.transport.connected.wait(30):
            raise ConnectionError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port}")
        self.access.watch_hangup()
        try:
            self.observer.start(self.campaign)
            current = self._await_fleet(current, stop)
            if stop():
                return
            closed = current.round if current.closed_at is not None else current.round - 1
            self._send_personal(closed, self.store.personal_messages(closed))  # again after a restart
            self._write_foundation(closed)  # again: a crash may have come between the close and the file
            self.owner.announce(current)
            while current.closed_at is None and not stop():
                current = self.close_if_due(current, fresh=self.turn())
            self.await_goodbyes(stop)
        except LeaseLost:
            goodbye = None  # another coordinator leads now: not ours to say the coordinator went offline
            raise
        finally:
            self.transport.stop(goodbye)
            self.observer.stop()
            self.store.close()
        if ended:
            raise CampaignFinished(f"campaign {self.campaign} finished with round {current.round}: nothing to serve; "
                                   f"start the next campaign with an empty state_dir (this one: {self.cfg.state_dir})")

    def resume(self) -> RoundRow:
        """The open round (round 1 on a fresh start), with the strategy's state as of the last close."""
        latest = self.store.latest_round()
        if latest is not None:
            closed = latest.round if latest.closed_at is not None else latest.round - 1
            saved = self.store.strategy_state(closed)
            if saved is not None:
                self.strategy.load_state_dict(saved)
        if latest is None:
            latest = self.store.open_first_round(self.clock() + self.cfg.round_timeout_s, self.initial)
            log.info("fleet %s: campaign %s opened round 1", self.cfg.fleet, self.campaign)
            self.on_event("campaign", {"campaign": self.campaign})
        elif latest.closed_at is None:
            self._hold_late()
            accepted = [u.client_id for u in self.store.updates(latest.round)]
            log.info("resuming round %d with %d accepted updates %s", latest.round, len(accepted), accepted)
            self.on_event("resumed", {"round": latest.round, "accepted": accepted})
        return latest

    def _hold_late(self) -> None:
        """After a restart: the late updates received since the last close, to the engine again
        (twin history is written again as it was; each is held for the next close)."""
        closed = self.store.closed_rounds(1)
        for row in self.store.late_since(closed[0].closed_at if closed else 0.0):
            self._observe_late(ClientUpdate(row.client_id, self.store.load_update(row), row.n_samples, row.metrics),
                               row.round)

    def _observe_late(self, update: ClientUpdate, number: int) -> bool:
        """``update`` of closed round ``number`` to the engine, with the global state it was trained from."""
        return self.engine.observe_late(update, number, self.store.load_file(self.store.round(number).global_file))

    def _await_fleet(self, row: RoundRow, stop: Callable[[], bool]) -> RoundRow:
        """Hold a fresh round 1 until ``start_clients`` have registered, so the first round is
        not closed by whoever came up first; its deadline then starts from the announcement."""
        if row.round != 1 or self.store.updates(1) or self.store.client_count() >= self.cfg.start_clients:
            return row
        shown = -1
        while (registered := self.store.client_count()) < self.cfg.start_clients and not stop():
            if registered != shown:
                log.info("waiting for the fleet: %d/%d clients registered", registered, self.cfg.start_clients)
                self.on_event("waiting", {"registered": registered, "needed": self.cfg.start_clients})
                shown = registered
            self.turn()
        self.store.extend_deadline(1, self.clock() + self.cfg.round_timeout_s)
        return self.store.round(1)

    def await_goodbyes(self, stop: Callable[[], bool]) -> None:
        """After the last round, stay subscribed until every client has said it went offline
        (agents do when they see the end), at most ``linger_s``: the store's presence is then
        true when the process exits."""
        deadline = self.clock() + self.cfg.linger_s
        while self.store.online_clients() and not stop() and self.clock() < deadline:
            self.turn()
        if still := self.store.online_clients():
            log.info("exiting with clients still online (their Last Will or a retained 'offline' will tell): %s",
                     sorted(still))

    def _announce_presence(self) -> None:
        self.transport.publish(self.topics.coordinator_status, b"online", retain=True)

    def announce(self, row: RoundRow) -> None:
        """Publish the round (retained) so agents that join late get it too."""
        finished = row.closed_at is not None
        self.publish_round(row, row.result_file if finished else row.global_file, finished)

    def publish_round(self, row: RoundRow, state_file: str, finished: bool) -> None:
        """Round ``row`` with the state in ``state_file`` as the retained announcement (the end of
        the campaign if ``finished``)."""
        state = self.store.load_file(state_file)
        asked = None if finished else self.participants.named(row)
        header = RoundHeader(
            fleet=self.cfg.fleet, sender=SENDER, round=row.round, deadline_unix=row.deadline,
            model_signature=self.signature, finished=finished, campaign=self.campaign,
            **({} if asked is None else announced(asked)),
        )
        self.transport.publish(self.topics.round, encode(header, state), retain=True)
        self._announced = row
        self.on_event("announced", {"round": row.round, "finished": finished})

    # rounds ----------------------------------------------------------------------------------

    def close_if_due(self, row: RoundRow, fresh: bool = True) -> RoundRow:
        """Close the round if it is time; a close the store cannot take is tried again on the
        storage retry timer (nothing of it stays behind: ``_aggregate``)."""
        if self.storage_retry.waiting():
            return row
        try:
            return self._close_if_time(row, fresh)
        except STORAGE_ERRORS as err:
            self._storage_failed(f"the close of round {row.round}", err)
            return row

    def _close_if_time(self, row: RoundRow, fresh: bool) -> RoundRow:
        if (why := self.owner.overtaken(row)) is not None:
            return self.owner.close_round(row, self.store.updates(row.round), why)
        progress, why = self.participants.close_reason(row, fresh)
        if why is not None:
            updates = self.store.updates(row.round)
            try:
                return self.owner.close_round(row, updates, why)
            except TooFewScreened as short:
                self._short(row, short, {u.client_id for u in updates})
                return row
        now = self.clock()
        if now < row.deadline:
            return row
        deadline = now + self.cfg.round_timeout_s
        self.store.extend_deadline(row.round, deadline)
        log.warning("round %d: deadline passed with %d/%d updates; waiting until %.0f",
                    row.round, progress.reported, self.cfg.min_clients, deadline)
        return self.store.round(row.round)

    def _short(self, row: RoundRow, short: TooFewScreened, reported: set[str]) -> None:
        """A close attempt whose screen left fewer than ``min_clients`` on-time updates: nothing
        aggregated; the round waits on (``Participants.left_out``), to its deadline, then extended."""
        self.participants.left_out(row, reported & set(short.rejected), short)
        self.on_event("short", {"round": row.round, "passed": short.passed, "need": short.need,
                                "rejected": short.rejected})

    def close_round(self, row: RoundRow, updates: list, why: str) -> RoundRow:
        """Aggregate and store the round, then send personal messages and the next announcement."""
        last = row.round >= self.cfg.rounds
        result = self.aggregate(row, updates, why, None if last else self.clock() + self.cfg.round_timeout_s)
        self._write_foundation(row.round)
        self._send_personal(row.round, result.personal)
        following = self.store.round(row.round if last else row.round + 1)
        self.announce(following)
        return following

    def aggregate(self, row: RoundRow, updates: list, why: str, next_deadline: float | None) -> ClosedRound:
        """Run the round engine on ``updates`` and make its result durable (one transaction: the
        twins' history too), opening the next round with ``next_deadline`` unless it is None. If the
        store fails, the strategy, twins, trust and round policy are as before, to close again later."""
        engine = self.engine
        before = self.strategy.state_dict(), dict(engine.on_time), self.participants.standing, engine.late, engine.trust
        try:
            with self.store.batch():
                result = self._aggregate_in_batch(row, updates, why, next_deadline)
        except STORAGE_ERRORS:
            self.strategy.load_state_dict(before[0])
            engine.on_time, self.participants.standing, engine.late, engine.trust = before[1:]
            raise
        self._storage_succeeded()
        self._report_close(row.round, result, why)
        if self.on_close is not None:
            self.on_close(result)
        return result

    def _aggregate_in_batch(self, row: RoundRow, updates: list, why: str, next_deadline: float | None) -> ClosedRound:
        on_time = [
            ClientUpdate(u.client_id, self._decoded.pop((row.round, u.client_id), None) or self.store.load_update(u),
                         u.n_samples, u.metrics)
            for u in updates
        ]
        self._decoded.clear()
        roster = [ClientInfo(c.client_id, c.n_samples, c.latitude, c.longitude) for c in self.store.clients().values()
                  if self.access.allows(c.client_id) and self.participants.takes_part(row, c.client_id)]
        result = self.engine.close(row.round, self.store.load_file(row.global_file), on_time, roster,
                                   need=0 if self.owner.overtaken(row) else self.cfg.min_clients)
        self.store.save_strategy_state(row.round, self.strategy.state_dict())
        for client, tensors in result.personal.items():
            self.store.save_personal(row.round, client, tensors)
        metrics = {"clients": list(result.on_time), "imputed": list(result.imputed), "dropped": list(result.dropped),
                   "stale": list(result.stale),
                   **self.participants.closed(row, [u.client_id for u in updates]),
                   "twin": result.twin, "loss": result.loss, "closed_by": why, "rejected": result.rejected,
                   "clipped": list(result.clipped), "weight": result.weight, "trust": result.trust, **result.metrics}
        self.store.finish_round(row.round, metrics, result.global_state, next_deadline)
        for client, code in result.rejected.items():
            self.store.log("update", client, row.round, False, code, "left out of the round by the engine's screening")
            self.on_event("rejected", {"client": client, "code": code, "reason": "screening"})
        return result

    def _report_close(self, number: int, result: ClosedRound, why: str) -> None:
        rejected = self.store.refusals_in(number)
        self.on_event("closed", {"round": number, "accepted": len(result.on_time), "rejected": rejected,
                                 "imputed": list(result.imputed), "loss": result.loss, "why": why})
        log.info("round %d closed (%s): %d updates, %d imputed by %s, loss %.4f", number, why, len(result.on_time),
                 len(result.imputed), result.twin, result.loss)

    def _write_foundation(self, number: int) -> None:
        """Pretrain mode: the global model after round ``number`` as the fleet's foundation
        checkpoint (``coordinator.pretraining``); nothing before round 1 closes."""
        if self.cfg.mode != "pretrain" or number < 1:
            return
        path, digest = write_foundation(self.store.load_file(self.store.round(number).result_file),
                                        self.cfg.foundation_model, self.store.dir)
        log.info("round %d: foundation checkpoint %s (sha256 %s)", number, path, digest)
        self.on_event("foundation", {"round": number, "path": str(path), "sha256": digest})

    def _send_personal(self, number: int, messages: dict[str, TensorDict]) -> None:
        """Each client's own tensors of round ``number`` (FedPoD: personalized prompts) on its task
        topic (QoS 1), before the next round's announcement."""
        for client, tensors in messages.items():
            header = PersonalHeader(fleet=self.cfg.fleet, sender=SENDER, round=number, campaign=self.campaign)
            self.transport.publish(self.topics.agent(client, "task"), encode(header, tensors))

    # messages --------------------------------------------------------------------------------

    def turn(self) -> bool:
        """One turn of a service loop: a changed allow-list into force, then the messages waiting
        (whether there were any)."""
        if self.access.refresh():
            self._revoke()
        if self._held:
            self.storage_retry.wait(0.05)
            if not self.storage_retry.waiting():
                self._store(self._held)
            return not self._held
        self._report_dropped()
        batch = self._drain()
        if batch:
            self._process(batch)
        return bool(batch)

    def _revoke(self) -> None:
        """Registered clients the reloaded allow-list no longer names: offline from now on (no
        round waits for them, no twin stands in for them) and refused from their next message."""
        for client, row in self.store.clients().items():
            if not self.access.allows(client):
                if row.online:
                    self.store.set_online(client, False)
                log.warning("revoked: %s is no longer in allowed_clients", client)
                self.on_event("revoked", {"client": client})

    def _report_dropped(self) -> None:
        """What the intake's rate limits dropped since their last report: one refusal row per
        client and kind (the count in its reason), not one per message."""
        for dropped in self.throttle.report():
            reason = (f"{dropped.count} {dropped.kind} messages over the rate limit of intake.{dropped.kind} "
                      f"dropped unread in {dropped.over_s:.0f} s")
            log.warning("%s: %s", dropped.client, reason)
            try:
                record(self.store, dropped.kind, dropped.client, Refusal.of("rate_limited", reason))
            except STORAGE_ERRORS as err:  # counted in the log and the metric; the row waits for no one
                log.error("the rate-limit report of %s could not be stored: %s", dropped.client, err)
            self.on_event("throttled", {"client": dropped.client, "kind": dropped.kind, "count": dropped.count})

    def _admitted(self, message: Incoming) -> bool:
        """Whether the intake's rate limits let ``message`` in (a dropped one is counted, not read)."""
        client = self.topics.client_of(message.topic)
        return client is None or self.throttle.admit(client, message.topic.rsplit("/", 1)[-1])

    def _drain(self, limit: int = COORDINATOR_RECEIVE_WINDOW) -> list[Incoming]:
        """Wait briefly for one message, then take whatever else is already queued."""
        try:
            batch = [self.transport.inbox.get(timeout=0.05)]
        except queue.Empty:
            return []
        while len(batch) < limit:
            try:
                batch.append(self.transport.inbox.get_nowait())
            except queue.Empty:
                break
        return batch

    def _process(self, batch: list[Incoming]) -> None:
        """Messages over a client's rate limit are acknowledged unread; the rest are stored."""
        admitted: list[Incoming] = []
        for message in batch:
            if self._admitted(message):
                admitted.append(message)
            else:
                self.transport.ack(message)
        if admitted:
            self._store(admitted)

    def _store(self, batch: list[Incoming]) -> None:
        """Validate and persist a batch in one transaction, each message guarded in its own
        savepoint (``coordinator.intake``); only then reply, update memory and acknowledge. A
        batch the store cannot take (full disk, database gone) is held, unacknowledged, and tried
        again on the storage retry timer; no further message is taken meanwhile."""
        try:
            effects = with_retries(partial(self._commit, batch), f"a batch of {len(batch)} messages")
        except STORAGE_ERRORS as err:
            self._held = batch
            self._storage_failed(f"a batch of {len(batch)} messages", err)
            return
        self._held = []
        self._storage_succeeded()
        try:
            for effect in effects:
                effect()
            self.on_event("ingested", {"messages": len(batch), "bytes": sum(len(m.payload) for m in batch)})
        finally:  # stored: acknowledged even when an effect ends the service (a site refused upstream)
            for message in batch:
                self.transport.ack(message)

    def _storage_failed(self, what: str, err: Exception) -> None:
        """``what`` could not be stored: the next try after the storage retry timer's pause."""
        pause = self.storage_retry.failed()
        log.error("could not store %s (failure %d in a row; trying again in %.1f s): %s", what,
                  self.storage_retry.failures, pause, err)

    def _storage_succeeded(self) -> None:
        """The store took a write: nothing waits, and the next failure pauses ``base_s`` again."""
        if self.storage_retry.failures:
            log.info("the store takes writes again after %d failed tries", self.storage_retry.failures)
        self.storage_retry.reset()

    def _commit(self, batch: list[Incoming]) -> Effects:
        if not batch:
            return []
        with self.store.batch():
            return [effect for message in batch for effect in self._guard(message)]

    def _guard(self, message: Incoming) -> Effects:
        """One message through ``intake.guarded``: its effects, or those of its refusal."""
        client = self.topics.client_of(message.topic) or message.topic
        routed = self.owner.route(message)
        if routed is not None:
            return routed
        outcome = guarded(self.store, partial(self._handle, message), client)
        if isinstance(outcome, Refusal):
            return self._refuse(client, message, outcome)
        return outcome

    def _handle(self, message: Incoming) -> Effects:
        if message.topic == self.topics.round:
            return self._on_round_message(message)
        client = self.topics.client_of(message.topic)
        leaf = message.topic.rsplit("/", 1)[-1]
        if client is None:
            return []
        if message.retain and leaf != "status":
            log.warning("ignoring a retained %s of %s: only presence may be retained", leaf, client)
            return [partial(self.on_event, "ignored", {"client": client, "topic": message.topic, "why": "retained"})]
        if not message.retain:
            self.store.seen(client)
        if leaf == "status":
            return self._on_status(client, message.payload)
        if leaf in ("hello", "update"):
            return self._on_envelope(client, leaf, message.payload)
        return []

    def _on_round_message(self, message: Incoming) -> Effects:
        """A retained round of another campaign (or unreadable) left on the broker would tell new
        agents the fleet is finished or on another model: overwrite it with ours (or clear it
        until we announce) and say what was there. Our own announcements echo back: ignored."""
        stale = stale_round(message, self.campaign, self.cfg.max_payload_bytes)
        if stale is None:
            return []
        log.warning("cleared the retained %s from the broker: this is campaign %s", stale, self.campaign)
        replace = (partial(self.transport.publish, self.topics.round, b"", retain=True) if self._announced is None
                   else partial(self.owner.announce, self._announced))
        return [partial(self.on_event, "cleared", {"retained": stale, "campaign": self.campaign}), replace]

    def _on_status(self, client: str, payload: bytes) -> Effects:
        if payload not in (b"online", b"offline") or not self.store.is_registered(client):
            return []
        if not self.access.allows(client):
            return []  # a revoked client stays offline
        self.store.set_online(client, payload == b"online")
        return [partial(self.on_event, "presence", {"client": client, "online": payload == b"online"})]

    def _on_envelope(self, client: str, leaf: str, payload: bytes) -> Effects:
        header, tensors = decode(payload, self.cfg.max_payload_bytes)
        check_sender(header, client, leaf, self.cfg.fleet)
        if isinstance(header, HelloHeader):
            return self._register(header)
        return self._accept_update(header, tensors, payload[len(payload) - header.body_bytes :])

    def _refuse(self, client: str, message: Incoming, refusal: Refusal) -> Effects:
        """Log, record and answer a refused message (the answer is about the round it claims)."""
        leaf = message.topic.rsplit("/", 1)[-1]
        log.warning("refused a %s from %s: %s", leaf, client, refusal.reason)
        record(self.store, leaf, client, refusal)
        about = leaf if leaf in ("hello", "update") else "other"
        return [self._reply(client, about, claimed_round(message.payload), False, refusal.code, refusal.reason),
                partial(self.on_event, "rejected", {"client": client, "code": refusal.code, "reason": refusal.reason})]

    def _register(self, hello: HelloHeader) -> Effects:
        if not self.access.allows(hello.sender):
            raise ProtocolError("not_allowed", f"{hello.sender!r} is not in allowed_clients")
        check_model(hello, self.signature, self.settings)
        self.store.register(hello)
        self.store.log("hello", hello.sender, None, True)
        return [self._reply(hello.sender, "hello", 0, True),
                partial(self.on_event, "registered", {"client": hello.sender}), *self.owner.registered(hello)]

    def overtaken(self, row: RoundRow) -> str | None:
        """None: the fleet's own rounds wait for their quorum (``RoundPolicy``)."""
        return None

    def registered(self, hello: HelloHeader) -> Effects:
        """Nothing beyond the reply: the fleet's coordinator answers to no one."""
        return []

    def route(self, message: Incoming) -> Effects | None:
        """None: every message on the coordinator's subscriptions is its gateways' or its round's."""
        return None

    def _accept_update(self, header: UpdateHeader, tensors: TensorDict, body: bytes) -> Effects:
        client, current = header.sender, self.store.latest_round()
        if header.campaign != self.campaign:
            raise ProtocolError("wrong_campaign", f"update for campaign {header.campaign!r}, this is {self.campaign!r}")
        if not self.access.allows(client):
            raise ProtocolError("not_allowed", f"{client!r} is not in allowed_clients (revoked)")
        if not self.store.is_registered(client):
            raise ProtocolError("unknown_client", f"{client!r} has not registered (send hello first)")
        if header.round > current.round:
            raise ProtocolError("future_round", f"round {header.round} has not started; current is {current.round}")
        if header.round <= self.store.forgotten_through():
            raise ProtocolError("forgotten_round", f"round {header.round} is older than the rounds whose records are "
                                f"kept (store.keep_records): too late even for the twins")
        if self.store.has_update(header.round, client):
            raise ProtocolError("duplicate", f"round {header.round} already has an update from {client!r}")
        check_tensors(tensors, self.update_layout)
        check_replay(header, self.announced_digest)
        late = header.round < current.round or current.closed_at is not None
        if not late and not self.participants.takes_part(current, client):
            raise ProtocolError("not_asked", f"round {current.round} did not ask {client!r} to train")
        self.store.save_update(
            header.round, client, header.n_samples, body, header.body_sha256, header.metrics, late=late
        )
        if late:
            return self._late(ClientUpdate(client, tensors, header.n_samples, header.metrics), header.round)
        self.store.log("update", client, current.round, True)
        return [partial(self._decoded.__setitem__, (current.round, client), tensors),
                self._reply(client, "update", current.round, True),
                partial(self.on_event, "accepted", {"client": client, "round": current.round})]

    def announced_digest(self, number: int) -> str | None:
        """The body_sha256 of round ``number``'s announcement: what an update trained from its
        global state names in ``global_sha256`` (None: never announced here). The last
        ``KEPT_DIGESTS`` rounds' are kept."""
        if number not in self._digests:
            row = self.store.find_round(number)
            if row is None:
                return None
            if len(self._digests) >= KEPT_DIGESTS:
                del self._digests[min(self._digests)]
            self._digests[number] = body_digest(self.store.load_file(row.global_file))
        return self._digests[number]

    def _late(self, update: ClientUpdate, number: int) -> Effects:
        """A stored update for a closed round: twin history and a stand-in at the next close, from
        a client sometimes on time."""
        client = update.client_id
        if self._observe_late(update, number):
            code, reason = "late", ("the round had closed: held for the next close (buffered)" if self.engine.buffer
                                    else "the round had closed: kept as twin history")
        else:
            code, reason = "late_no_twin", "the round had closed and the client has no recent on-time update: not used"
        self.store.log("update", client, number, True, code, reason)
        return [self._reply(client, "update", number, True, code, reason),
                partial(self.on_event, "late", {"client": client, "round": number, "code": code})]

    def _reply(
        self, client: str, about: str, number: int, accepted: bool, code: str = "", reason: str = ""
    ) -> Callable[[], object]:
        """The answer for the agent's own task topic, to send once the batch is durable;
        ``number`` is the round the message was about."""
        header = ReplyHeader(
            fleet=self.cfg.fleet, sender=SENDER, round=number, accepted=accepted, about=about, code=code,
            reason=reason, campaign=self.campaign,
        )
        return partial(self.transport.publish, self.topics.agent(client, "task"), encode(header))
