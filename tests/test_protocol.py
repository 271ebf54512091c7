"""The wire envelope: round trips and every kind of bad payload, each with its reason code."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from edge_agent.protocol import (
    MAGIC,
    PLACEHOLDER_DIGEST,
    PREFIX,
    HelloHeader,
    ProtocolError,
    RoundHeader,
    UpdateHeader,
    check_tensors,
    decode,
    encode,
    signature,
)
from edge_agent.topics import Topics

LIMIT = 1 << 20
TENSORS = {"shared.w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "shared.b": torch.zeros(3)}


def update(**fields: object) -> UpdateHeader:
    return UpdateHeader(fleet="demo", sender="site-1", round=3, n_samples=100, global_sha256=PLACEHOLDER_DIGEST,
                        **fields)


def test_update_round_trip_keeps_header_and_tensors() -> None:
    payload = encode(update(metrics={"loss": 0.5}), TENSORS)
    header, tensors = decode(payload, LIMIT)
    assert isinstance(header, UpdateHeader)
    assert header.round == 3 and header.metrics == {"loss": 0.5} and header.body_bytes > 0
    assert tensors.keys() == TENSORS.keys()
    assert all(torch.equal(tensors[k], TENSORS[k]) for k in TENSORS)


def test_header_only_messages_have_an_empty_body() -> None:
    hello = HelloHeader(fleet="demo", sender="a", n_features=3, n_samples=10, model_signature="ab" * 16)
    header, tensors = decode(encode(hello), LIMIT)
    assert header == hello and tensors == {}


def _reencode_header(payload: bytes, change: dict) -> bytes:
    _, _, length = PREFIX.unpack_from(payload)
    header = json.loads(payload[PREFIX.size : PREFIX.size + length])
    header.update(change)
    raw = json.dumps(header).encode()
    return PREFIX.pack(MAGIC, 1, len(raw)) + raw + payload[PREFIX.size + length :]


@pytest.mark.parametrize(
    "mutate, code",
    [
        (lambda p: b"\x00garbage\xff" * 3, "bad_magic"),
        (lambda p: p[:5], "truncated"),
        (lambda p: p[:-10], "truncated"),
        (lambda p: p[:4] + bytes([9]) + p[5:], "bad_version"),
        (lambda p: PREFIX.pack(MAGIC, 1, 5) + b"{nope", "bad_header"),
        (lambda p: _reencode_header(p, {"fleet": "bad fleet/with slash"}), "bad_header"),
        (lambda p: _reencode_header(p, {"kind": "launch"}), "bad_header"),
        (lambda p: _reencode_header(p, {"round": -1}), "bad_header"),
        (lambda p: _reencode_header(p, {"extra": 1}), "bad_header"),
        (lambda p: p[:-1] + bytes([p[-1] ^ 1]), "bad_digest"),
        (lambda p: p + b"x" * LIMIT, "too_large"),
    ],
)
def test_bad_envelopes_are_rejected_with_a_reason_code(mutate, code: str) -> None:
    payload = encode(update(), TENSORS)
    with pytest.raises(ProtocolError) as err:
        decode(mutate(payload), LIMIT)
    assert err.value.code == code


def test_a_body_that_is_not_safetensors_is_rejected() -> None:
    body = b"\x80\x04\x95 pickle bytes are never loaded"
    header_only = encode(update())
    forged = _reencode_header(header_only, {"body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest()})
    with pytest.raises(ProtocolError) as err:
        decode(forged + body, LIMIT)
    assert err.value.code == "bad_body"


def test_non_finite_metrics_are_rejected_in_the_header() -> None:
    with pytest.raises(ValueError, match="not finite"):
        update(metrics={"loss": float("nan")})


def test_check_tensors_names_shapes_dtypes_and_finiteness() -> None:
    expected = {k: (tuple(v.shape), v.dtype) for k, v in TENSORS.items()}
    check_tensors(TENSORS, expected)
    cases = [
        ({"shared.w": TENSORS["shared.w"]}, "bad_tensors"),
        ({**TENSORS, "shared.extra": torch.zeros(1)}, "bad_tensors"),
        ({**TENSORS, "shared.b": torch.zeros(4)}, "bad_tensors"),
        ({**TENSORS, "shared.b": torch.zeros(3, dtype=torch.float64)}, "bad_tensors"),
        ({**TENSORS, "shared.b": torch.tensor([0.0, float("inf"), 1.0])}, "not_finite"),
    ]
    for tensors, code in cases:
        with pytest.raises(ProtocolError) as err:
            check_tensors(tensors, expected)
        assert err.value.code == code


def test_signature_depends_on_config_and_layout() -> None:
    base = signature(TENSORS, '{"backbone": "dlinear"}')
    assert base == signature(dict(reversed(TENSORS.items())), '{"backbone": "dlinear"}')
    assert base != signature(TENSORS, '{"backbone": "gru"}')
    assert base != signature({**TENSORS, "shared.b": torch.zeros(4)}, '{"backbone": "dlinear"}')


def test_topics_and_client_extraction() -> None:
    topics = Topics("demo")
    assert topics.agent("site-1", "update") == "edgefl/demo/agents/site-1/update"
    assert topics.agents("hello") == "edgefl/demo/agents/+/hello"
    assert topics.round == "edgefl/demo/round"
    assert topics.client_of("edgefl/demo/agents/site-1/update") == "site-1"
    assert topics.client_of("edgefl/other/agents/site-1/update") is None
    with pytest.raises(ValueError):
        Topics("no/slashes")


def test_round_header_requires_a_deadline() -> None:
    with pytest.raises(ValueError):
        RoundHeader(fleet="demo", sender="coordinator", round=1, deadline_unix=0, model_signature="ab" * 16)


def test_envelope_size_is_the_encoded_length_without_encoding() -> None:
    from edge_agent.protocol import envelope_size

    header = UpdateHeader(fleet="f", sender="client-7", round=3, n_samples=12, metrics={"loss": 0.25},
                          global_sha256=PLACEHOLDER_DIGEST)
    for tensors in ({"a": torch.randn(3, 5), "b.c": torch.arange(7), "d": torch.tensor(1.5, dtype=torch.float64)},
                    {"x": torch.zeros(0, 4)}, {}):
        assert envelope_size(header, tensors) == len(encode(header, tensors))
