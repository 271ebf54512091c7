"""The one client side of the coordinator protocol, used by the edge agent and by a site
aggregator (whose coordinator is the central one): presence, hello, the re-sending of uploads
not yet answered, and the coordinator's replies through one refusal backoff.

Introductions are asked for by events (a session came up, the coordinator came online, the
backoff's delay after a refusal ran out, the client's facts changed) and made from the client's
own loop (``tick``), never from the broker's network thread. A (re)connect re-sends every upload
still waiting for its answer; the coordinator coming online only repeats the hello (it may have
missed it, while uploads wait in its persistent session)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from edge_agent.protocol import HelloHeader, ReplyHeader, encode
from edge_agent.refusals import RETRY, RefusalBackoff, settled
from edge_agent.topics import Topics
from edge_agent.transport import Transport

ONLINE, OFFLINE = b"online", b"offline"


class ProtocolClient:
    """One sender's side of the protocol over ``transport``: ``hello()`` gives the registration to
    send (None: nothing to register yet), ``uploads()`` the uploads to re-send on introduction."""

    def __init__(self, transport: Transport, topics: Topics, sender: str, backoff: RefusalBackoff,
                 hello: Callable[[], HelloHeader | None], uploads: Callable[[], Iterable[bytes]]):
        self.transport, self.topics, self.sender, self.backoff = transport, topics, sender, backoff
        self.hello, self.uploads = hello, uploads
        self._wanted: bool | None = None  # an introduction asked for: with (True) or without re-sending
        self._lock = threading.Lock()  # the network thread asks, the client's loop introduces
        transport.on_connected.append(self._connected)

    def topic(self, kind: str) -> str:
        """This sender's topic of ``kind`` (hello, update, status, task)."""
        return self.topics.agent(self.sender, kind)

    def _connected(self) -> None:
        """A session came up: say we are online and introduce ourselves, re-sending uploads."""
        self.transport.publish(self.topic("status"), ONLINE, retain=True)
        self.want(resend=True)

    def want(self, resend: bool) -> None:
        """Ask for an introduction at the next ``tick`` (re-sending uploads if any ask says so)."""
        with self._lock:
            self._wanted = resend or bool(self._wanted)

    def coordinator_status(self, payload: bytes) -> None:
        """The coordinator's retained status: once it is online, register again."""
        if payload == ONLINE:
            self.want(resend=False)

    def tick(self) -> None:
        """From the client's loop: make the introduction asked for, or the one the backoff scheduled."""
        with self._lock:
            wanted, self._wanted = self._wanted, None
        if self.backoff.due():
            wanted = True
        if wanted is not None:
            self.introduce(resend=wanted)

    def introduce(self, resend: bool) -> None:
        """Send the hello (if there is one to send) and, with ``resend``, the unanswered uploads."""
        if (hello := self.hello()) is not None:
            self.send("hello", encode(hello))
        for upload in self.uploads() if resend else ():
            self.send("update", upload)

    def send(self, kind: str, payload: bytes) -> None:
        """Publish ``payload`` on this sender's topic of ``kind``."""
        self.transport.publish(self.topic(kind), payload)

    def answered(self, reply: ReplyHeader) -> None:
        """The coordinator's reply, for the backoff: an acceptance resets it, a refusal of the client
        schedules the next introduction (or raises ``Refused`` after repeated terminal ones)."""
        if reply.accepted:
            self.backoff.accepted()
        else:
            self.backoff.refused(reply.code, reply.about, reply.reason)

    def goodbye(self) -> None:
        """End the session, saying we are offline (retained) while it is still up."""
        self.transport.stop(self.topic("status"))


def settles_upload(reply: ReplyHeader) -> bool:
    """Whether ``reply`` ends an upload's re-sending: taken, or refused for a reason a re-send cannot fix."""
    return reply.about == "update" and reply.code not in RETRY and settled(reply.accepted, reply.code)
