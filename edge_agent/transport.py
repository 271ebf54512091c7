"""The one seam between a service and its broker: what the coordinator, a site aggregator and the
agent use of their session (``Transport``, which ``edge_agent.mqtt.Connection`` is) and an
in-memory one (``MemoryTransport``) that tests and simulations drive message by message, the
service's own loop unchanged; a ``MemoryBroker`` connects such sessions to each other."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Incoming:
    """One received message, still undecoded."""

    topic: str
    payload: bytes
    mid: int
    qos: int
    retain: bool


@runtime_checkable
class Transport(Protocol):
    """A broker session as the coordinator uses it: messages come into ``inbox`` and are
    acknowledged by hand once stored; ``on_connected`` runs whenever a session comes up."""

    inbox: queue.Queue[Incoming]
    connected: threading.Event
    on_connected: list[Callable[[], None]]

    def start(self) -> None:
        """Connect in the background (``connected`` is set once a session is up)."""

    def stop(self, status_topic: str | None = None) -> None:
        """Say goodbye on ``status_topic`` (retained 'offline') where given, and disconnect."""

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> object:
        """Send ``payload`` on ``topic`` at QoS 1."""

    def ack(self, message: Incoming) -> None:
        """Acknowledge ``message``: the broker will not deliver it again."""


class MemoryTransport:
    """A ``Transport`` without a broker: messages are delivered by hand, what goes out is recorded;
    a session of a ``MemoryBroker`` also sends what it publishes to the sessions subscribed to it."""

    def __init__(self, broker: MemoryBroker | None = None, subscriptions: Sequence[str] = ()) -> None:
        self.inbox: queue.Queue[Incoming] = queue.Queue()
        self.connected = threading.Event()  # a broker's session is up once started, a bare one at once
        if broker is None:
            self.connected.set()
        self.on_connected: list[Callable[[], None]] = []
        self.published: list[tuple[str, bytes, bool]] = []  # (topic, payload, retain), in order
        self.acked: list[Incoming] = []
        self.broker, self.subscriptions = broker, tuple(subscriptions)
        self._mids = itertools.count(1)

    def deliver(self, *messages: Incoming) -> None:
        """Put ``messages`` in the inbox, as the broker hands them over."""
        for message in messages:
            self.inbox.put(message)

    def start(self) -> None:
        """A session comes up at once (the broker's retained messages it subscribes to arrive):
        the ``on_connected`` callbacks run, as on a broker's CONNACK."""
        self.connected.set()
        if self.broker is not None:
            self.broker.attach(self)
        for callback in self.on_connected:
            callback()

    def stop(self, status_topic: str | None = None) -> None:
        """The goodbye recorded as published (retained 'offline'), then no session."""
        if status_topic and self.connected.is_set():
            self.publish(status_topic, b"offline", retain=True)
        self.connected.clear()
        if self.broker is not None:
            self.broker.detach(self)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Record the message as sent (and route it, on a broker's session that is up)."""
        self.published.append((topic, payload, retain))
        if self.broker is not None and self.connected.is_set():
            self.broker.route(topic, payload, retain)

    def ack(self, message: Incoming) -> None:
        """Record the acknowledgement."""
        self.acked.append(message)

    def drain(self) -> list[Incoming]:
        """What arrived so far and was not yet taken, in order (the inbox is empty after)."""
        arrived = []
        while not self.inbox.empty():
            arrived.append(self.inbox.get_nowait())
        return arrived

    def subscribed(self, topic: str) -> bool:
        """Whether one of this session's topic filters matches ``topic`` (MQTT's rules, by paho)."""
        from paho.mqtt.client import topic_matches_sub

        return any(topic_matches_sub(pattern, topic) for pattern in self.subscriptions)

    def arrived(self, topic: str, payload: bytes, retain: bool) -> None:
        """A message the broker routed here, as a QoS 1 delivery with its own packet id."""
        self.inbox.put(Incoming(topic, payload, next(self._mids), 1, retain))


class MemoryBroker:
    """A broker in memory for ``MemoryTransport`` sessions: each publish goes to every session
    subscribed to its topic, and the last retained message of a topic (an empty one clears it)
    to each session that subscribes later, as an MQTT broker does."""

    def __init__(self) -> None:
        self.retained: dict[str, bytes] = {}
        self.sessions: list[MemoryTransport] = []
        self._lock = threading.Lock()

    def session(self, *subscriptions: str) -> MemoryTransport:
        """A new client session subscribed to ``subscriptions``, connected once it is started."""
        return MemoryTransport(self, subscriptions)

    def attach(self, transport: MemoryTransport) -> None:
        with self._lock:
            self.sessions.append(transport)
            retained = list(self.retained.items())
        for topic, payload in retained:
            if transport.subscribed(topic):
                transport.arrived(topic, payload, True)

    def detach(self, transport: MemoryTransport) -> None:
        with self._lock:
            self.sessions = [s for s in self.sessions if s is not transport]

    def route(self, topic: str, payload: bytes, retain: bool) -> None:
        with self._lock:
            if retain and payload:
                self.retained[topic] = payload
            elif retain:
                self.retained.pop(topic, None)
            receivers = [s for s in self.sessions if s.subscribed(topic)]
        for receiver in receivers:
            receiver.arrived(topic, payload, False)
