"""Bounds on names and JSON that devices and configs send, shared by the wire protocol
(``edge_agent.protocol``) and the sensor payloads: kept free of torch so the serving-only
process can check readings without the protocol's tensor side."""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
MAX_ROUND = 10**6  # rounds of a campaign (configs) and round numbers on the wire
MAX_JSON_DEPTH = 8
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects, brackets inside strings ignored (linear scan)."""
    depth = deepest = 0
    for token in _JSON_TOKEN.findall(raw):
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth = max(depth - 1, 0)
    return deepest
