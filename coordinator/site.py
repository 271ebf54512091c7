"""A site aggregator: the coordinator of one site's gateways and one client of the central one.

To its gateways it runs a ``Coordinator`` (same intake, store, guard and round engine with FedAvg
and the twins) whose rounds it owns (``RoundOwner``): they come from the central coordinator. To
the central coordinator it is a client like an edge agent, through the same ``ProtocolClient``
(presence, hello, re-sent uploads, refusal backoff), and its round result goes up as an update.
The site broker's bridge maps the central broker's topics under ``uplink/``: the central round
announcement and this site's task topic come in, its hello/update/status go out (the gateways'
own topics stay on the site broker). For each central round the site re-announces it to its
gateways (same envelope, so agents are unchanged), closes it before the central deadline and
sends ONE update: the sample-weighted mean of its gateways' updates (twins imputed here) with
n_samples = their summed weight, so central FedAvg over sites equals flat FedAvg.

Crash safety as in the coordinator: a central announcement is stored (state and record together)
before it is acknowledged; a gateway's update before it is; after ``kill -9`` the open round
resumes with every accepted update. A closed round's upload is re-sent until the central
coordinator answers it (``duplicate`` counts as delivered), so the upward send is idempotent.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

from coordinator.config import UPLINK, AggregatorConfig
from coordinator.intake import Effects, Refusal, guarded
from coordinator.server import SENDER, Coordinator, coordinator_connection
from coordinator.store import RoundRow, Store
from edge_agent.protocol import (
    MAX_FEATURES, MAX_SAMPLES, HelloHeader, PersonalHeader, ProtocolError, ReplyHeader, RoundHeader, UpdateHeader,
    check_tensors, decode, encode,
)
from edge_agent.protocol_client import OFFLINE, ProtocolClient, settles_upload
from edge_agent.refusals import RETRY, RefusalBackoff
from edge_agent.tensors import TensorDict, layout_of
from edge_agent.topics import Topics
from edge_agent.transport import Incoming, Transport

log = logging.getLogger("edgefl.site")


class SiteAggregator:
    """Serves the central coordinator's rounds to one site's gateways until the campaign ends: the
    owner of the rounds of the ``Coordinator`` it runs towards them (``gateways``)."""

    def __init__(self, cfg: AggregatorConfig, on_event: Callable[[str, dict], None] | None = None,
                 store: Store | None = None, config_path: Path | None = None, transport: Transport | None = None):
        self.cfg, self.uplink, self.site = cfg, Topics(cfg.fleet, UPLINK), cfg.site  # uplink: the central broker's
        self._central: dict | None = None  # the last central announcement, as stored (``_own``)
        if transport is None:
            transport = coordinator_connection(cfg, f"edgefl-site-{cfg.site}", self.uplink.round,
                                               self.uplink.coordinator_status, self.uplink.agent(cfg.site, "task"))
        self.gateways = Coordinator(cfg, on_event, store, config_path, transport, owner=self._own)
        self.transport, self.on_event = transport, self.gateways.on_event
        self.client = ProtocolClient(transport, self.uplink, cfg.site, RefusalBackoff(f"site {cfg.site}"),
                                     self._hello_up, self._undelivered)  # the central coordinator's client
        self._ended = False  # the central end was passed on to the gateways

    def _own(self, gateways: Coordinator) -> SiteAggregator:
        """The owner of ``gateways``' rounds: this site, with the central announcement last stored."""
        self.store = gateways.store
        self._central = json.loads(self.store.meta("central") or "null")
        return self

    def campaign_id(self) -> str:
        return self.store.meta("campaign") or ""  # the central coordinator's, once it announced a round

    def turn(self) -> bool:
        """One turn of the gateways' coordinator: the messages waiting (the central ones included)."""
        return self.gateways.turn()

    # lifecycle -------------------------------------------------------------------------------

    def serve(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Follow the central rounds until the central coordinator announces the end."""
        gateways = self.gateways
        self.transport.start()
        if not self.transport.connected.wait(30):
            raise ConnectionError(f"cannot reach the broker at {self.cfg.broker.host}:{self.cfg.broker.port}")
        try:
            gateways.access.watch_hangup()
            gateways.observer.start(gateways.campaign or "(waiting for the central coordinator)")
            self._resume_site()
            while not stop() and not self._ended:
                self.client.tick()
                self.turn()
                self.follow()
            gateways.await_goodbyes(stop)
        finally:
            if self.transport.connected.is_set():
                self.transport.publish(gateways.topics.coordinator_status, OFFLINE, retain=True)
            self.client.goodbye()
            gateways.observer.stop()
            self.store.close()

    def _resume_site(self) -> None:
        latest = self.store.latest_round()
        if latest is None:
            log.info("site %s: waiting for the central coordinator's first round", self.site)
            return
        accepted = [u.client_id for u in self.store.updates(latest.round)]
        log.info("site %s resuming round %d (%s) with %d accepted updates %s", self.site, latest.round,
                 "closed" if latest.closed_at else "open", len(accepted), accepted)
        self.on_event("resumed", {"round": latest.round, "accepted": accepted})
        self.announce(latest)

    def announce(self, row: RoundRow) -> None:
        """Re-announce the central round to the gateways (the central end once it came)."""
        finished = bool(self._central and self._central["finished"])
        self.gateways.publish_round(row, self._central["file"] if finished else row.global_file, finished)

    # rounds ----------------------------------------------------------------------------------

    def follow(self) -> None:
        """Open the round the central coordinator announced last; close ours through the
        coordinator's own close: when our gateways have reported (or our deadline passed), or at
        once when the central one moved on (``overtaken``)."""
        latest, central = self.store.latest_round(), self._central
        if central is None:
            return
        if latest is not None and latest.closed_at is None:
            latest = self.gateways.close_if_due(latest)
            if latest.closed_at is None:
                return
        if central["finished"]:
            if latest is not None:
                self.announce(latest)
            self._ended = True
            log.info("site %s: the central coordinator finished the campaign with round %d", self.site,
                     central["round"])
            return
        if latest is None or central["round"] > latest.round:
            deadline = min(central["deadline"] - self.cfg.deadline_margin_s, self.gateways.clock() + self.cfg.round_timeout_s)
            self.announce(self.store.open_round(central["round"], deadline, central["file"]))

    def overtaken(self, row: RoundRow) -> str | None:
        """The central coordinator moved on from round ``row`` (or ended the campaign): what our
        gateways sent is all the round gets."""
        central = self._central
        if central is not None and (central["round"] != row.round or central["finished"]):
            return "the central round moved on"
        return None

    def close_round(self, row: RoundRow, updates: list, why: str) -> RoundRow:
        """Aggregate the site's round and send the partial aggregate up."""
        self.gateways.aggregate(row, updates, why, None)
        self._send_up(self.store.round(row.round))
        return self.store.round(row.round)

    def _send_up(self, row: RoundRow) -> None:
        """Send the closed round's partial aggregate up (once the central coordinator answers it,
        it is no longer re-sent: ``_undelivered``)."""
        if (upload := self._upload(row)) is not None:
            header, payload = upload
            self.client.send("update", payload)
            self.on_event("sent", {"round": row.round, "n_samples": header.n_samples})

    def _upload(self, row: RoundRow) -> tuple[UpdateHeader, bytes] | None:
        """The round's partial aggregate as this site's update (weight: the summed sample counts),
        bound to the central announcement it started from (the round's global state), with its
        header; None when no gateway update or twin went into it."""
        weight = min(row.metrics.get("weight", 0), MAX_SAMPLES)
        if weight < 1:
            log.warning("round %d: no gateway update or twin to send up", row.round)
            return None
        loss = row.metrics.get("loss", math.nan)
        header = UpdateHeader(fleet=self.cfg.fleet, sender=self.site, round=row.round, n_samples=weight,
                              metrics={"loss": loss} if math.isfinite(loss) else {}, campaign=self.gateways.campaign,
                              global_sha256=self.gateways.announced_digest(row.round))
        return header, encode(header, self.store.load_file(row.result_file))

    def _undelivered(self) -> list[bytes]:
        """The uploads of the closed rounds the central coordinator has not answered yet."""
        delivered = int(self.store.meta("delivered") or 0)
        rows = [row for row in self.store.rounds() if row.closed_at is not None and row.round > delivered]
        return [upload[1] for row in rows if (upload := self._upload(row)) is not None]

    def _hello_up(self) -> HelloHeader | None:
        """The site's registration upward, once ``start_clients`` gateways registered here (sent
        again whenever their summed sample count changes)."""
        count, features, samples = self.store.client_totals()  # per registration: sums, not the table
        if not count or count < self.cfg.start_clients:
            return None
        return HelloHeader(fleet=self.cfg.fleet, sender=self.site, n_features=min(features, MAX_FEATURES),
                           n_samples=min(samples, MAX_SAMPLES), model_signature=self.gateways.signature,
                           model_settings=self.gateways.settings)

    def registered(self, hello: HelloHeader) -> Effects:
        """A gateway registered here: the site's own registration upward may follow (``_hello_up``)."""
        return [partial(self.client.introduce, resend=False)]

    # messages from the central broker ----------------------------------------------------------

    def route(self, message: Incoming) -> Effects | None:
        """The uplink's messages in their own guard, whose refusals are logged (no reply: the
        central coordinator is not our client); None for the gateways' messages."""
        if not message.topic.startswith(self.uplink.root + "/"):
            return None
        outcome = guarded(self.store, partial(self._on_uplink, message), "the central coordinator")
        if isinstance(outcome, Refusal):
            log.error("ignored a message on %s: %s", message.topic, outcome.reason)
            return [partial(self.on_event, "uplink_refused", {"topic": message.topic, "code": outcome.code})]
        return outcome

    def _on_uplink(self, message: Incoming) -> Effects:
        if message.topic == self.uplink.coordinator_status:
            return [partial(self.client.coordinator_status, message.payload)]
        if not message.payload:
            return []  # a cleared retained round
        header, tensors = decode(message.payload, self.cfg.max_payload_bytes)
        if header.fleet != self.cfg.fleet or header.sender != SENDER:
            raise ProtocolError("wrong_sender", f"a {header.kind} of {header.sender!r} in fleet {header.fleet!r}")
        if isinstance(header, RoundHeader) and message.topic == self.uplink.round:
            return self._on_central_round(header, tensors)
        if isinstance(header, ReplyHeader):
            return self._on_central_reply(header)
        if isinstance(header, PersonalHeader):
            raise ProtocolError("unsupported", "personal messages (FedPoD) are not routed through sites yet")
        raise ProtocolError("wrong_kind", f"a {header.kind!r} message on {message.topic}")

    def _on_central_round(self, header: RoundHeader, state: TensorDict) -> Effects:
        """Store the central announcement (its state and its record) for ``follow``."""
        gateways = self.gateways
        if header.model_signature != gateways.signature:
            raise ProtocolError("bad_signature", "the central coordinator runs another model than this site")
        check_tensors(state, layout_of(gateways.initial))
        if gateways.campaign and header.campaign != gateways.campaign:
            raise ProtocolError("wrong_campaign", f"central campaign {header.campaign!r}; this site's state_dir "
                                f"belongs to {gateways.campaign!r} (give the site a fresh state_dir to join)")
        if not gateways.campaign and header.finished:
            return []  # the retained end of a campaign this site took no part in
        known = self._central
        if known and (header.round, header.finished) <= (known["round"], known["finished"]):
            return []
        name = "uplink/final.safetensors" if header.finished else f"uplink/round_{header.round:05d}.safetensors"
        self.store.save_tensors(name, state)
        central = {"round": header.round, "deadline": header.deadline_unix, "finished": header.finished, "file": name}
        self.store.set_meta("central", json.dumps(central))
        self.store.set_meta("campaign", header.campaign)
        return [partial(setattr, self, "_central", central), partial(setattr, gateways, "campaign", header.campaign),
                partial(self.on_event, "central", central)]

    def _on_central_reply(self, reply: ReplyHeader) -> Effects:
        """The central coordinator's answer; refusals go to the backoff (the next hello, or ``Refused``
        after repeated terminal ones, raised once the batch is stored)."""
        answer = [partial(self.client.answered, reply)]
        if settles_upload(reply):
            self.store.set_meta("delivered", str(max(reply.round, int(self.store.meta("delivered") or 0))))
            answer.append(partial(self.on_event, "delivered", {"round": reply.round, "code": reply.code}))
        if not reply.accepted and reply.code not in RETRY and reply.code != "duplicate":
            log.error("the central coordinator refused our %s of round %d: %s", reply.about, reply.round, reply.reason)
            answer.append(partial(self.on_event, "refused", {"about": reply.about, "code": reply.code}))
        return answer
