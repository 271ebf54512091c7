"""Who a round asks to train, as its announcement says it (torch-free: virtual gateways and probes
read it too). Up to ``MAX_PARTICIPANTS`` the announcement names the clients; beyond, up to
``MAX_ASKED``, it carries a ``ASKED_DIGEST_BYTES``-byte SHA-256 prefix of each id, base64, so a
round of thousands still fits one header (``edge_agent.protocol.MAX_HEADER_BYTES``). A client not
asked whose prefix collides (about one in 2**48 per participant) trains for nothing: the
coordinator checks full ids and refuses its update as ``not_asked``."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
from collections.abc import Sequence

MAX_PARTICIPANTS = 900  # client ids a round announcement may name (64-character ids fit the header)
ASKED_DIGEST_BYTES = 6
MAX_ASKED = 6000  # participants of one round: 36,000 digest bytes, 48,000 base64 characters
MAX_ASKED_CHARS = 4 * -(-MAX_ASKED * ASKED_DIGEST_BYTES // 3)


def asked_digest(client_id: str) -> bytes:
    """The prefix of ``client_id``'s SHA-256 that stands for it in a large round's announcement."""
    return hashlib.sha256(client_id.encode()).digest()[:ASKED_DIGEST_BYTES]


def announced(ids: Sequence[str]) -> dict[str, list[str] | str]:
    """The announcement's fields for a round asking ``ids``: their names up to
    ``MAX_PARTICIPANTS``, else (up to ``MAX_ASKED``) their digests as ``asked``."""
    if len(ids) <= MAX_PARTICIPANTS:
        return {"participants": list(ids)}
    if len(ids) > MAX_ASKED:
        raise ValueError(f"a round asks at most {MAX_ASKED} clients, not {len(ids)}")
    return {"asked": base64.b64encode(b"".join(sorted(asked_digest(i) for i in ids))).decode()}


@functools.lru_cache(maxsize=8)
def asked_digests(encoded: str) -> frozenset[bytes]:
    """The digests of an ``asked`` field (cached: every gateway of a process reads one round's);
    ValueError where it is not base64 of whole digests, at most ``MAX_ASKED`` of them."""
    if len(encoded) > MAX_ASKED_CHARS:
        raise ValueError(f"asked: {len(encoded)} characters, over {MAX_ASKED_CHARS}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except binascii.Error as err:
        raise ValueError(f"asked: not base64 ({err})") from None
    if len(raw) % ASKED_DIGEST_BYTES:
        raise ValueError(f"asked: {len(raw)} bytes is not a whole number of {ASKED_DIGEST_BYTES}-byte digests")
    return frozenset(raw[i:i + ASKED_DIGEST_BYTES] for i in range(0, len(raw), ASKED_DIGEST_BYTES))


def is_asked(participants: Sequence[str] | None, asked: str | None, client_id: str) -> bool:
    """Whether a round whose announcement has these fields asks ``client_id`` (neither: everyone)."""
    if participants is not None:
        return client_id in participants
    return asked is None or asked_digest(client_id) in asked_digests(asked)


def asked_count(participants: Sequence[str] | None, asked: str | None) -> int | None:
    """How many clients the round asks (None: every client)."""
    if participants is not None:
        return len(participants)
    return None if asked is None else len(asked_digests(asked))
