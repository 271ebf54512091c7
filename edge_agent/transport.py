"""The one seam between a service and its broker: what the coordinator uses of its session
(``Transport``, which ``edge_agent.mqtt.Connection`` is) and an in-memory one (``MemoryTransport``)
that tests and simulations drive message by message, the service's own loop unchanged."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
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
    """A ``Transport`` without a broker: messages are delivered by hand, what goes out is recorded."""

    def __init__(self) -> None:
        self.inbox: queue.Queue[Incoming] = queue.Queue()
        self.connected = threading.Event()
        self.connected.set()
        self.on_connected: list[Callable[[], None]] = []
        self.published: list[tuple[str, bytes, bool]] = []  # (topic, payload, retain), in order
        self.acked: list[Incoming] = []

    def deliver(self, *messages: Incoming) -> None:
        """Put ``messages`` in the inbox, as the broker hands them over."""
        for message in messages:
            self.inbox.put(message)

    def start(self) -> None:
        """A session comes up at once: the ``on_connected`` callbacks run, as on a broker's CONNACK."""
        self.connected.set()
        for callback in self.on_connected:
            callback()

    def stop(self, status_topic: str | None = None) -> None:
        """The goodbye recorded as published (retained 'offline'), then no session."""
        if status_topic and self.connected.is_set():
            self.publish(status_topic, b"offline", retain=True)
        self.connected.clear()

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        """Record the message as sent."""
        self.published.append((topic, payload, retain))

    def ack(self, message: Incoming) -> None:
        """Record the acknowledgement."""
        self.acked.append(message)
