"""Virtual gateways for ``bench/fleet_load.py``: many MQTT connections per process, each speaking
the edge agent's protocol (``edge_agent/agent.py``) without torch or training.

A gateway connects with a persistent session and a Last Will ("offline", retained) on its status
topic, says "online" (retained) and hello, says hello again whenever the coordinator comes
online, answers every round announcement with one update for that round (the campaign taken from
the announcement) and, on the finished announcement, says "offline" and disconnects. Messages
are built from the parent's encoded templates by re-stamping the JSON header (``restamp``): the
tensors are the parent's bytes. One selector loop drives all connections of a process (paho's
external-loop API), so a process holds thousands of gateways on one thread.
"""

from __future__ import annotations

import selectors
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from mqtt_bench import envelope_header, raise_fd_limit, restamp

from edge_agent.asked import is_asked
from edge_agent.mqtt import paho_client

SESSION_EXPIRY_S = 600
MISC_EVERY_S = 1.0  # keepalive pings and retries (paho's loop_misc)


@dataclass(frozen=True)
class FleetSpec:
    """What every gateway of one run shares: where the broker is and the message templates."""

    port: int
    fleet: str
    hello: bytes
    updates: tuple[bytes, ...]  # update envelopes with different bodies, assigned round-robin


def station_place(gateway_id: str) -> dict[str, float]:
    """A fixed made-up position per gateway, spread over western Europe (for the dashboard's map)."""
    spread = zlib.crc32(gateway_id.encode())
    return {"latitude": round(44 + (spread % 1200) / 100, 3), "longitude": round(-5 + (spread // 1200 % 2500) / 100, 3)}


class Gateway:
    """One virtual gateway: its MQTT client and what it has sent and heard."""

    def __init__(self, spec: FleetSpec, client_id: str, update: bytes, tally: Counter):
        self.spec, self.id, self.update, self.tally = spec, client_id, update, tally
        root = f"edgefl/{spec.fleet}"
        self.round_topic, self.coordinator_topic = f"{root}/round", f"{root}/coordinator/status"
        self.agent_root = f"{root}/agents/{client_id}"
        self.sent: set[int] = set()
        self.done = False
        self.client = paho_client(f"edgefl-agent-{spec.fleet}-{client_id}")
        self.client.will_set(f"{self.agent_root}/status", b"offline", qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message

    def connect(self) -> None:
        """Open the TCP connection and queue CONNECT (a persistent session, as real agents use)."""
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY_S
        self.client.connect("127.0.0.1", self.spec.port, keepalive=60, clean_start=False, properties=props)

    def _publish(self, leaf: str, payload: bytes, retain: bool = False) -> None:
        self.client.publish(f"{self.agent_root}/{leaf}", payload, qos=1, retain=retain)

    def _on_connect(self, client: mqtt.Client, _u, _f, reason_code, _p) -> None:
        if reason_code.is_failure:
            self.tally[f"connect_{reason_code}"] += 1
            return
        client.subscribe([(self.round_topic, 1), (f"{self.agent_root}/task", 1), (self.coordinator_topic, 1)])
        self._publish("status", b"online", retain=True)
        self._hello()
        self.tally["connected"] += 1

    def _hello(self) -> None:
        self._publish("hello", restamp(self.spec.hello, sender=self.id, **station_place(self.id)))

    def _on_message(self, _c, _u, message: mqtt.MQTTMessage) -> None:
        if message.topic == self.coordinator_topic:
            if message.payload == b"online":
                self._hello()
        elif message.topic == self.round_topic and message.payload:
            self._on_round(envelope_header(message.payload))
        elif message.topic.endswith("/task"):
            header = envelope_header(message.payload)
            self.tally[f"{header['about']}_{'accepted' if header['accepted'] else header['code']}"] += 1

    def _on_round(self, header: dict) -> None:
        if header["finished"]:
            self._publish("status", b"offline", retain=True)
            self.client.disconnect()
            self.done = True
        elif not is_asked(header.get("participants"), header.get("asked"), self.id):
            self.tally["rounds_not_asked"] += 1
        elif header["round"] not in self.sent:
            self.sent.add(header["round"])
            self._publish("update", restamp(self.update, sender=self.id, round=header["round"],
                                            campaign=header["campaign"], global_sha256=header["body_sha256"]))
            self.tally["updates_sent"] += 1


class Driver:
    """A selector loop over the sockets of many gateways (paho's external-loop callbacks keep
    each socket's write interest current)."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()

    def attach(self, client: mqtt.Client) -> None:
        client.on_socket_open = lambda c, _u, sock: self.selector.register(sock, selectors.EVENT_READ, c)
        client.on_socket_close = lambda _c, _u, sock: self.selector.unregister(sock)
        client.on_socket_register_write = lambda c, _u, sock: self.selector.modify(
            sock, selectors.EVENT_READ | selectors.EVENT_WRITE, c)
        client.on_socket_unregister_write = lambda c, _u, sock: self.selector.modify(sock, selectors.EVENT_READ, c)

    def run(self, clients: list[mqtt.Client], until, deadline: float, tick=None) -> None:
        """Serve every socket until ``until()`` or the deadline, calling ``tick()`` (if given)
        before each pass over the ready sockets (so at least every 0.2 s)."""
        misc = time.monotonic()
        while not until() and time.monotonic() < deadline:
            if tick is not None:
                tick()
            for key, events in self.selector.select(timeout=0.2):
                if events & selectors.EVENT_READ:
                    key.data.loop_read()
                if events & selectors.EVENT_WRITE:
                    key.data.loop_write()
            if time.monotonic() - misc > MISC_EVERY_S:
                misc = time.monotonic()
                for client in clients:
                    client.loop_misc()


def run_gateways(spec: FleetSpec, ids: list[str], report, deadline_s: float) -> None:
    """Process entry: connect the gateways ``ids``, say when all are connected, serve rounds
    until every gateway saw the end (or ``deadline_s``), then put the tally on ``report``."""
    raise_fd_limit()
    tally: Counter = Counter()
    driver = Driver()
    gateways = [Gateway(spec, cid, spec.updates[i % len(spec.updates)], tally) for i, cid in enumerate(ids)]
    deadline = time.monotonic() + deadline_s
    started = time.monotonic()
    for gateway in gateways:
        driver.attach(gateway.client)
        gateway.connect()
    clients = [g.client for g in gateways]
    driver.run(clients, lambda: tally["connected"] >= len(ids), deadline)
    report.put(("connected", len(ids), time.monotonic() - started))
    driver.run(clients, lambda: all(g.done for g in gateways), deadline)
    driver.run(clients, lambda: not driver.selector.get_map(), time.monotonic() + 5)  # flush goodbyes
    report.put(("done", dict(tally), "torch" in sys.modules))
