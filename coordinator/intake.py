"""The guard around every message the coordinator handles: nothing a device sends can stop it.

A handler runs inside its own savepoint of the open batch and returns what to do once the batch
is durable (replies, events, in-memory state). A ``ProtocolError`` becomes a refusal with its
code; a storage error (``OSError``: read-only folder, full disk; a database's ``OperationalError``)
is retried a few times, then raised: the store failed, not the message, so the whole batch is held
and tried again later (``Coordinator.turn``); any other exception is logged with its
traceback and refused as ``internal``. A failed attempt leaves nothing behind: its rows and tensors
roll back (``Store.savepoint``), while the other messages of the batch stand.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from coordinator.store import Store
from coordinator.store_backends import STORAGE_ERRORS
from edge_agent.transport import Incoming
from edge_agent.config import differences
from edge_agent.protocol import MAX_REASON, Header, HelloHeader, ProtocolError, RoundHeader, UpdateHeader, decode

log = logging.getLogger("edgefl.coordinator")
Effects = list[Callable[[], object]]
STORAGE_ATTEMPTS = 3
RETRY_PAUSE_S = 0.05
T = TypeVar("T")


@dataclass(frozen=True)
class Refusal:
    """Why one message was not accepted: a stable ``code`` and a readable ``reason``."""

    code: str
    reason: str

    @classmethod
    def of(cls, code: str, reason: str) -> "Refusal":
        """A refusal whose reason is storable and sendable whatever the message held (bounded
        length, no lone surrogates from JSON escapes, no NUL: PostgreSQL text cannot hold one)."""
        return cls(code, reason.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\\x00")[:MAX_REASON])


def guarded(store: Store, handle: Callable[[], Effects], client: str) -> Effects | Refusal:
    """Run one message's ``handle`` inside a savepoint: its effects, or why it was refused (a
    storage error that persists is raised, for the batch)."""

    def attempt() -> Effects:
        with store.savepoint():
            return handle()

    try:
        return with_retries(attempt, f"a message from {client}")
    except ProtocolError as err:
        return Refusal.of(err.code, str(err))
    except STORAGE_ERRORS:
        raise
    except Exception as err:  # the guard's purpose: no message may stop the coordinator
        log.exception("internal error on a message from %s", client)
        return Refusal.of("internal", f"the coordinator failed on it: {type(err).__name__}: {err}")


def with_retries(action: Callable[[], T], what: str) -> T:
    """``action``, tried again after a short pause on a storage error, at most
    ``STORAGE_ATTEMPTS`` times in all; the last storage error is raised."""
    for attempt in range(1, STORAGE_ATTEMPTS):
        try:
            return action()
        except STORAGE_ERRORS as err:
            log.warning("storage error on %s (attempt %d of %d): %s", what, attempt, STORAGE_ATTEMPTS, err)
            time.sleep(RETRY_PAUSE_S * attempt)
    return action()


def record(store: Store, kind: str, client: str, refusal: Refusal) -> None:
    """Put a refusal in the event log under the current round, in its own savepoint; a log that
    cannot be written (storage trouble) is reported here and does not fail the batch."""
    try:
        with store.savepoint():
            current = store.latest_round()
            store.log(kind, client, current.round if current else None, False, refusal.code, refusal.reason)
    except STORAGE_ERRORS as err:
        log.error("could not log the refusal of a %s from %s (%s): %s", kind, client, refusal.code, err)


def check_sender(header: Header, client: str, leaf: str, fleet: str) -> None:
    """A message on ``agents/<client>/<leaf>`` must be of that kind, fleet and sender."""
    if header.kind != leaf:
        raise ProtocolError("wrong_kind", f"a {header.kind!r} message on an {leaf!r} topic")
    if header.fleet != fleet:
        raise ProtocolError("wrong_fleet", f"message for fleet {header.fleet!r}, this is {fleet!r}")
    if header.sender != client:
        raise ProtocolError("wrong_sender", f"sender {header.sender!r} does not match topic client {client!r}")


def check_model(hello: HelloHeader, signature: str, settings: dict) -> None:
    """A hello must name the fleet's model ``signature``; the refusal says what differs from the
    fleet's ``settings``, field by field where the hello says what its signature stands for."""
    if hello.model_signature == signature:
        return
    fields = differences(settings, hello.model_settings) if hello.model_settings is not None else []
    if fields:
        reason = f"the agent's model differs from the fleet's (set in coordinator.toml): {'; '.join(fields)}"
    elif hello.model_settings is not None:
        reason = "the agent's settings match the fleet's but its tensors do not (another edgefl version?)"
    else:
        reason = "the agent's model differs from the coordinator's"
    raise ProtocolError("bad_signature", reason)


def check_replay(header: UpdateHeader, announced: Callable[[int], str | None]) -> None:
    """An update must name the global state it was trained from: ``global_sha256``, the body
    digest of its round's announcement (``announced(round)``); another one means it was
    recorded in another round and sent again (or trained from a stale global)."""
    bound = announced(header.round)
    if bound is None:
        raise ProtocolError("unknown_round", f"round {header.round} was never announced here")
    if header.global_sha256 != bound:
        raise ProtocolError("replay", f"an update for round {header.round} trained from another global state "
                            f"(global_sha256 {header.global_sha256[:16]}..., round {header.round} announced "
                            f"{bound[:16]}...): a replayed or stale update")


def stale_round(message: Incoming, campaign: str, max_bytes: int) -> str | None:
    """What a retained round message of another campaign (or an unreadable one) holds, in words;
    None for our own announcements and anything not retained."""
    if not message.retain or not message.payload:
        return None
    try:
        header, _ = decode(message.payload, max_bytes)
    except ProtocolError as err:
        return f"an unreadable round message ({err})"
    if header.campaign == campaign:
        return None
    ended = " (finished)" if isinstance(header, RoundHeader) and header.finished else ""
    return f"round {header.round}{ended} of campaign {header.campaign or '(none)'}"
