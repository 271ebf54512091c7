"""Gateways for ``bench/soak.py``: the virtual gateways of ``bench/fleet_gateways.py`` (no torch,
many per process) with what a fleet does over half an hour, and the hostile roles of issue 27.

- **Training time**: a gateway answers an announcement a uniform ``[0, train_s]`` later (only
  while connected: one that dropped sends once it is back, like an agent that trained offline).
- **Churn**: every second, ``churn_per_min / 60`` of the churning gateways drop (an MQTT 5
  DISCONNECT with reason 0x04, so the broker publishes their Last Will "offline" as on a lost
  link) and reconnect ``offline_s`` later on their persistent session (queued announcements and
  answers are delivered then; unacknowledged updates are re-sent by paho).
- **Ledger**: the rounds each gateway sent an update for and the answer it heard for each
  (``accepted`` or the refusal code), written to a JSON file at the end, so the parent can count
  the updates lost against the coordinator's store.
- **Roles** (hostile run): ``silent`` registers, keeps its retained "online" and never sends an
  update (never churns); ``storm`` answers rounds like the others but sends hellos at
  ``storm_hellos_s`` and reconnects every ``storm_reconnect_s`` with its own valid credentials;
  the sign flipper needs no class: it is a gateway whose update template is the reversed delta.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from fleet_gateways import Driver, FleetSpec, Gateway
from mqtt_bench import envelope_header, raise_fd_limit

WITH_WILL = 4  # MQTT 5 DISCONNECT reason "Disconnect with Will Message": the broker sends the Will
CONNECT_TIMEOUT_S = 300
MAX_PENDING_HELLOS = 500  # the storm's unacknowledged hellos at most (paho would queue the rest in memory)


@dataclass(frozen=True)
class SoakPlan:
    """How the gateways of one run behave over time (the same in both runs)."""

    train_s: float = 10.0
    churn_per_min: float = 0.10
    offline_s: float = 5.0
    storm_hellos_s: float = 200.0
    storm_reconnect_s: float = 2.0
    drain_s: float = 60.0
    seed: int = 0


class SoakGateway(Gateway):
    """A gateway that trains for a while, can drop and come back, and keeps a ledger."""

    def __init__(self, spec: FleetSpec, client_id: str, update: bytes, tally: Counter, plan: SoakPlan,
                 rng: random.Random):
        super().__init__(spec, client_id, update, tally)
        self.plan, self.rng = plan, rng
        self.due: list[tuple[float, dict]] = []  # announcements to answer, and when
        self.answers: dict[int, str] = {}  # round -> "accepted" or the refusal code
        self.answering = True
        self.back_at: float | None = None  # when a dropped gateway reconnects

    def _on_round(self, header: dict) -> None:
        if self.answering and not header["finished"]:
            self.due.append((time.monotonic() + self.rng.uniform(0, self.plan.train_s), header))

    def _on_message(self, client, userdata, message) -> None:
        super()._on_message(client, userdata, message)
        if message.topic.endswith("/task"):
            header = envelope_header(message.payload)
            if header.get("about") == "update" and header.get("round") is not None:
                self.answers[header["round"]] = "accepted" if header["accepted"] else header["code"]

    def tick(self, now: float) -> None:
        """Send the answers that are due (when connected); reconnect when it is time."""
        if self.back_at is not None and now >= self.back_at and self.client.socket() is None:
            self.back_at = None
            self.client.reconnect()
            self.tally["reconnects"] += 1
        if self.due and self.client.is_connected():
            ready = [header for at, header in self.due if at <= now]
            self.due = [(at, header) for at, header in self.due if at > now]
            for header in ready:
                super()._on_round(header)

    def drop(self, away_s: float) -> None:
        """Lose the link (the broker publishes the Will) and come back ``away_s`` later."""
        self.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=WITH_WILL))
        self.back_at = time.monotonic() + away_s
        self.tally["drops"] += 1

    def settled(self) -> bool:
        """Connected, and every update it sent has its answer."""
        return self.client.is_connected() and self.sent <= self.answers.keys()

    def ledger(self) -> dict:
        refused = {r: code for r, code in self.answers.items() if code != "accepted"}
        return {"sent": sorted(self.sent), "refused": refused,
                "unanswered": sorted(self.sent - self.answers.keys())}


class SilentGateway(SoakGateway):
    """Registered and "online", never sends an update."""

    def _on_round(self, header: dict) -> None:
        self.tally["silent_rounds_ignored"] += 1


class StormingGateway(SoakGateway):
    """Answers rounds, and storms: hellos at ``storm_hellos_s``, a reconnect every ``storm_reconnect_s``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.published = self.acknowledged = 0
        self.last, self.next_reconnect = time.monotonic(), time.monotonic() + self.plan.storm_reconnect_s
        self.client.on_publish = self._on_publish

    def _on_publish(self, *_args) -> None:
        self.acknowledged += 1

    def tick(self, now: float) -> None:
        super().tick(now)
        if not self.answering or not self.client.is_connected():
            self.last = now
            return
        owed = int((now - self.last) * self.plan.storm_hellos_s)
        if owed >= 1:
            self.last = now
        for _ in range(min(owed, MAX_PENDING_HELLOS - (self.published - self.acknowledged))):
            self._hello()
            self.published += 1
            self.tally["storm_hellos"] += 1
        if now >= self.next_reconnect:
            self.next_reconnect = now + self.plan.storm_reconnect_s
            self.drop(0.0)


ROLES = {"honest": SoakGateway, "silent": SilentGateway, "storm": StormingGateway}


class Churn:
    """Drops ``churn_per_min`` of ``pool`` per minute, spread over the minute."""

    def __init__(self, pool: list[SoakGateway], plan: SoakPlan, rng: random.Random):
        self.pool, self.plan, self.rng = pool, plan, rng
        self.owed, self.last = 0.0, time.monotonic()

    def tick(self, now: float) -> None:
        self.owed += len(self.pool) * self.plan.churn_per_min * (now - self.last) / 60
        self.last = now
        while self.owed >= 1:
            self.owed -= 1
            present = [g for g in self.rng.sample(self.pool, min(8, len(self.pool))) if g.client.is_connected()]
            if present:
                present[0].drop(self.plan.offline_s)


def build(spec: FleetSpec, plan: SoakPlan, ids: list[str], roles: dict[str, str], flipped: bytes,
          tally: Counter, rng: random.Random) -> list[SoakGateway]:
    """The gateways ``ids``; ``roles`` names the hostile ones (``flipper`` sends ``flipped``)."""
    gateways = []
    for i, cid in enumerate(ids):
        role = roles.get(cid, "honest")
        update = flipped if role == "flipper" else spec.updates[i % len(spec.updates)]
        gateways.append(ROLES.get(role, SoakGateway)(spec, cid, update, tally, plan, rng))
    return gateways


def run_soak_gateways(spec: FleetSpec, plan: SoakPlan, ids: list[str], roles: dict[str, str], flipped: bytes,
                      report, stop, ledger_path: str) -> None:
    """Process entry: connect ``ids`` and say so on ``report``; serve rounds with churn until
    ``stop`` is set; then stop answering and storming, reconnect everyone and wait (at most
    ``drain_s``) for the answers to the updates sent; write the ledger and put the tally on
    ``report`` (as ``fleet_load.collect`` reads it)."""
    raise_fd_limit()
    tally, driver, rng = Counter(), Driver(), random.Random(f"{plan.seed}-{ids[:1]}")
    gateways = build(spec, plan, ids, roles, flipped, tally, rng)
    clients = [g.client for g in gateways]
    started = time.monotonic()
    for gateway in gateways:
        driver.attach(gateway.client)
        gateway.connect()
    driver.run(clients, lambda: tally["connected"] >= len(ids), started + CONNECT_TIMEOUT_S)
    report.put(("connected", len(ids), time.monotonic() - started))
    churn = Churn([g for g in gateways if type(g) is SoakGateway], plan, rng)

    def tick() -> None:
        now = time.monotonic()
        churn.tick(now)
        for gateway in gateways:
            gateway.tick(now)

    driver.run(clients, stop.is_set, float("inf"), tick)
    for gateway in gateways:
        gateway.answering, gateway.due = False, []
        gateway.back_at = None if gateway.client.is_connected() else time.monotonic()
    driver.run(clients, lambda: all(g.settled() for g in gateways), time.monotonic() + plan.drain_s,
               lambda: [g.tick(time.monotonic()) for g in gateways])
    Path(ledger_path).write_text(json.dumps({g.id: g.ledger() for g in gateways}))
    report.put(("done", dict(tally), "torch" in sys.modules))
