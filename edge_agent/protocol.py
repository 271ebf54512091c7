"""The wire protocol shared by the edge agent and the coordinator.

A message is a small versioned binary envelope::

    b"EDFL" | schema version (1 byte) | header length (4 bytes, big endian) | JSON header | body

The header is validated by pydantic (one model per message kind, strict types: no coercion of
``"3"`` or ``true`` into a round); the body is a safetensors blob whose SHA-256 the header
carries. Nothing is ever unpickled. Parsing is bounded before anything recursive or costly runs:
header size, JSON nesting depth, integer digits, integer ranges (all within SQLite INTEGER),
string lengths and the number of metrics (see the constants below), so no input a device can
send makes the decoder raise anything but ``ProtocolError``. Topics live under
``edgefl/<fleet>/``; see ``edge_agent.topics.Topics``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from typing import Annotated, Literal, Union

from pydantic import (
    BaseModel, ConfigDict, Field, JsonValue, StringConstraints, TypeAdapter, ValidationError, field_validator,
    model_validator,
)
from safetensors import SafetensorError

from edge_agent.asked import MAX_ASKED_CHARS, MAX_PARTICIPANTS, asked_count, asked_digests, is_asked
from edge_agent.limits import MAX_JSON_DEPTH, MAX_ROUND, NAME_PATTERN, json_depth
from edge_agent.tensors import (
    Framework, Layout, LayoutError, TensorDict, check_layout, dtype_name, first_non_finite, layout_of, tensors_from_bytes,
    tensors_to_bytes,
)

MAGIC = b"EDFL"
SCHEMA_VERSION = 1
PREFIX = struct.Struct(">4sBI")
CAMPAIGN_PATTERN = r"^[A-Za-z0-9_.-]{0,64}$"
MAX_HEADER_BYTES = 64 * 1024
MAX_INT_DIGITS = 20
MAX_SAMPLES = 10**9
MAX_FEATURES = 10**6
MAX_BODY_BYTES = 2**40
MAX_METRICS = 32
MAX_REASON = 500
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
PLACEHOLDER_DIGEST = "0" * 64  # where only a header's size matters
Metrics = dict[Annotated[str, StringConstraints(pattern=NAME_PATTERN)], float]
ClientId = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]

class ProtocolError(ValueError):
    """A message that cannot be accepted; ``code`` is a stable machine-readable reason."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str = Field(pattern=NAME_PATTERN)
    sender: str = Field(pattern=NAME_PATTERN, description="client id, or 'coordinator'")
    round: int = Field(0, ge=0, le=MAX_ROUND)
    body_sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$")
    body_bytes: int = Field(0, ge=0, le=MAX_BODY_BYTES)
    encoding: Literal["safetensors"] = "safetensors"
    campaign: str = Field("", pattern=CAMPAIGN_PATTERN,
                          description="the federation run this message belongs to; '' where the sender knows none yet")


class HelloHeader(_Header):
    """An agent registers: what it holds and which model it runs."""

    kind: Literal["hello"] = "hello"
    n_features: int = Field(ge=1, le=MAX_FEATURES)
    n_samples: int = Field(ge=1, le=MAX_SAMPLES)
    latitude: float | None = Field(None, ge=-90, le=90)
    longitude: float | None = Field(None, ge=-180, le=180)
    model_signature: str = Field(pattern=r"^[0-9a-f]{16,64}$")
    model_settings: dict[str, JsonValue] | None = Field(None, description="what the signature stands for "
                                                        "(edge_agent.config.signed_settings), so a refusal can name "
                                                        "the fields that differ")


class UpdateHeader(_Header):
    """An agent's shared parameters after training for ``round``."""

    kind: Literal["update"] = "update"
    n_samples: int = Field(ge=1, le=MAX_SAMPLES)
    global_sha256: str = Field(pattern=DIGEST_PATTERN, description="the body_sha256 of the round announcement "
                               "trained from: binds the update to that round's global state, so a replay of it "
                               "in another round is refused")
    metrics: Metrics = Field(default_factory=dict, max_length=MAX_METRICS)

    @field_validator("metrics")
    @classmethod
    def _finite(cls, metrics: Metrics) -> Metrics:
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"metrics {bad} are not finite")
        return metrics


class RoundHeader(_Header):
    """The coordinator announces ``round`` with the global shared parameters as body."""

    kind: Literal["round"] = "round"
    deadline_unix: float = Field(gt=0, le=1e11)
    model_signature: str = Field(pattern=r"^[0-9a-f]{16,64}$")
    finished: bool = False
    participants: list[ClientId] | None = Field(None, max_length=MAX_PARTICIPANTS, description="the clients asked "
                                                 "to train this round; None: every client (or ``asked``)")
    asked: str | None = Field(None, max_length=MAX_ASKED_CHARS, description="a round asking more than "
                              "MAX_PARTICIPANTS: their id digests, base64 (edge_agent.asked)")

    @model_validator(mode="after")
    def _one_list(self) -> RoundHeader:
        if self.participants is not None and self.asked is not None:
            raise ValueError("a round names its participants or gives their digests, not both")
        if self.asked is not None:
            asked_digests(self.asked)
        return self

    def asks(self, client_id: str) -> bool:
        """Whether this round asks ``client_id`` to train."""
        return is_asked(self.participants, self.asked, client_id)

    @property
    def asked_count(self) -> int | None:
        """How many clients this round asks (None: every client)."""
        return asked_count(self.participants, self.asked)


class ReplyHeader(_Header):
    """The coordinator's answer to one agent message: accepted or rejected with a reason."""

    kind: Literal["reply"] = "reply"
    accepted: bool
    about: Literal["hello", "update", "other"]
    code: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,64}$")
    reason: str = Field("", max_length=MAX_REASON)


class PersonalHeader(_Header):
    """Prompt mode: the coordinator's personalized prompts for one agent after ``round`` closed
    (body: ``personalized`` and ``neighbours``, FedPoD eq. 9)."""

    kind: Literal["personal"] = "personal"


Header = Annotated[
    Union[HelloHeader, UpdateHeader, RoundHeader, ReplyHeader, PersonalHeader], Field(discriminator="kind")
]
_HEADER = TypeAdapter(Header)


def encode(header: _Header, tensors: TensorDict | None = None) -> bytes:
    """Serialize a header and optional tensors into one envelope (digest and size filled in)."""
    body = _body_of(tensors)
    header = header.model_copy(update={"body_sha256": _digest(body), "body_bytes": len(body)})
    raw = header.model_dump_json().encode()
    return PREFIX.pack(MAGIC, SCHEMA_VERSION, len(raw)) + raw + body


def envelope_size(header: _Header, tensors: TensorDict | None = None) -> int:
    """``len(encode(header, tensors))`` without serializing or hashing the tensors: a safetensors
    body's size follows from the names, shapes and dtypes alone (sized once per layout)."""
    size = _body_size(_layout_key(layout_of(tensors))) if tensors else 0
    sized = header.model_copy(update={"body_sha256": PLACEHOLDER_DIGEST if size else "", "body_bytes": size})
    return PREFIX.size + len(sized.model_dump_json().encode()) + size


def largest_envelope(layout: Layout) -> int:
    """The most bytes a legal envelope with a body laid out as ``layout`` can take: the largest
    header ``decode`` admits (``MAX_HEADER_BYTES``) plus that body (what bounds a fleet's messages)."""
    return PREFIX.size + MAX_HEADER_BYTES + _body_size(_layout_key(layout))


def body_digest(tensors: TensorDict | None) -> str:
    """The ``body_sha256`` that ``encode`` gives a message carrying ``tensors`` ('' for none)."""
    return _digest(_body_of(tensors))


def _body_of(tensors: TensorDict | None) -> bytes:
    return tensors_to_bytes(tensors) if tensors else b""


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest() if body else ""


def _layout_key(layout: Layout) -> tuple[tuple[str, tuple[int, ...], object], ...]:
    """``layout`` as ``_body_size``'s cache key: hashable, in the body's order."""
    return tuple((name, shape, dtype) for name, (shape, dtype) in layout.items())


@functools.lru_cache(maxsize=64)
def _body_size(layout: tuple[tuple[str, tuple[int, ...], object], ...]) -> int:
    import torch  # the sizes of torch's dtypes: only the sides that hold torch tensors size bodies

    return len(tensors_to_bytes({name: torch.zeros(shape, dtype=getattr(torch, dtype_name(dtype)))
                                 for name, shape, dtype in layout}))


def decode(payload: bytes, max_bytes: int, framework: Framework = "pt") -> tuple[Header, TensorDict]:
    """Parse and verify an envelope, its tensors as ``framework``'s (numpy arrays for the
    torch-free training agent); raises ``ProtocolError`` naming what is wrong."""
    if len(payload) > max_bytes:
        raise ProtocolError("too_large", f"payload of {len(payload)} bytes exceeds the limit of {max_bytes}")
    if len(payload) < PREFIX.size:
        raise ProtocolError("truncated", f"{len(payload)} bytes is shorter than the {PREFIX.size}-byte prefix")
    magic, version, length = PREFIX.unpack_from(payload)
    if magic != MAGIC:
        raise ProtocolError("bad_magic", f"not an edgefl envelope (starts with {payload[:4]!r})")
    if version != SCHEMA_VERSION:
        raise ProtocolError("bad_version", f"schema version {version} is not supported (this side speaks {SCHEMA_VERSION})")
    end = PREFIX.size + length
    if end > len(payload):
        raise ProtocolError("truncated", f"header claims {length} bytes, only {len(payload) - PREFIX.size} present")
    header = _parse_header(payload[PREFIX.size : end])
    body = payload[end:]
    if len(body) != header.body_bytes:
        raise ProtocolError("truncated", f"body has {len(body)} bytes, header says {header.body_bytes}")
    if body and hashlib.sha256(body).hexdigest() != header.body_sha256:
        raise ProtocolError("bad_digest", "body does not match its SHA-256 digest")
    return header, _parse_body(body, framework)


def claimed_round(payload: bytes) -> int:
    """The round a (possibly invalid) envelope says it is about, or 0; never raises."""
    try:
        _, _, length = PREFIX.unpack_from(payload)
        value = _load_json(payload[PREFIX.size : PREFIX.size + length]).get("round", 0)
    except (struct.error, ProtocolError, AttributeError):
        return 0
    return value if type(value) is int and 0 <= value <= MAX_ROUND else 0


def _load_json(raw: bytes) -> object:
    """JSON within the header bounds: size and nesting depth are checked before parsing (the
    parser recurses), integers are parsed only when short (long ones cost quadratic time),
    NaN and Infinity are not JSON."""
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError("bad_header", f"header of {len(raw)} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise ProtocolError("bad_header", f"header nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw, parse_int=_short_int, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as err:
        raise ProtocolError("bad_header", f"header is not JSON ({str(err)[:200]})") from None


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _parse_header(raw: bytes) -> Header:
    data = _load_json(raw)
    try:
        return _HEADER.validate_python(data, strict=True)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))[:80] or 'header'}: {e['msg']}" for e in err.errors()[:5])
        raise ProtocolError("bad_header", problems) from err


def _parse_body(body: bytes, framework: Framework) -> TensorDict:
    if not body:
        return {}
    try:
        return tensors_from_bytes(body, framework)
    except (SafetensorError, ValueError, RuntimeError, TypeError, KeyError) as err:  # numpy has no bfloat16
        raise ProtocolError("bad_body", f"body is not a safetensors blob ({err})") from err


def check_tensors(tensors: TensorDict, expected: Layout) -> None:
    """Names, shapes and dtypes must match ``expected`` exactly and every value be finite."""
    try:
        check_layout(tensors, expected, "body")
    except LayoutError as err:
        raise ProtocolError("bad_tensors", str(err)) from None
    bad = first_non_finite(tensors)
    if bad is not None:
        raise ProtocolError("not_finite", f"{bad} holds NaN or inf values")


def signature(state: TensorDict, config_json: str) -> str:
    """A short hash identifying a model: its config plus the shared tensors' names/shapes/dtypes."""
    layout = sorted((k, tuple(v.shape), str(v.dtype)) for k, v in state.items())
    return hashlib.sha256(json.dumps([config_json, layout]).encode()).hexdigest()[:32]
