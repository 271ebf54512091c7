"""Sensor payloads as gateways see them, parsed into (value, timestamp) or refused with a kind.

Accepted shapes:

- a plain number, as text: ``21.5`` (surrounding whitespace allowed; the feature has no ``path``);
- a JSON object with the value at a dot path: zigbee2mqtt's ``{"temperature": 21.5, "last_seen":
  "2021-01-01T00:00:00.000Z"}`` (path ``temperature``), Tasmota's ``{"Time": "2021-01-01T00:00:00",
  "BME280": {"Temperature": 21.5}}`` (path ``BME280.Temperature``). A value may be a JSON number or
  a string holding one.

Timestamps (at ``time_path``): ISO 8601 strings starting with a date (``YYYY-MM-DD``), with a zone
or ``Z``; a string without a zone (Tasmota's ``Time``) is taken as UTC, so set the device clock to
UTC. Numbers are unix time: seconds below 10**11 (before the year 5138), else milliseconds.

Refusal kinds, also those the ingest adds (``BadReading.kind``):

- ``too_large``: payload over ``MAX_PAYLOAD_BYTES`` or JSON nested deeper than ``MAX_JSON_DEPTH``;
- ``not_a_number``: not JSON (when a path is set), or a value that is a bool, null, object, list
  or a string that is not a number;
- ``missing_field``: the value's or timestamp's path is not in the JSON;
- ``not_finite``: NaN, infinity, or beyond float32's range (the table stores float32);
- ``bad_timestamp``: a timestamp that is not one of the forms above or out of range;
- ``too_old`` / ``in_future`` / ``out_of_order`` / ``unknown_topic`` / ``retained`` / ``error``:
  see ``edge_agent.sensors.ingest``.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime

import numpy as np

from edge_agent.limits import MAX_JSON_DEPTH, json_depth
from edge_agent.times import NS_PER_S, from_datetime, from_unix

MAX_PAYLOAD_BYTES = 64 * 1024
_MILLISECONDS_FROM = 1e11
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_SHOWN = 60


class BadReading(ValueError):
    """A reading that is refused: ``kind`` (one of the documented strings) and a short ``detail``."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def read(raw: bytes, path: str | None, time_path: str | None = None) -> tuple[float, int | None]:
    """The value (a finite float) and, with ``time_path``, the timestamp of one payload (UTC
    nanoseconds since the epoch)."""
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise BadReading("too_large", f"{len(raw)} bytes (at most {MAX_PAYLOAD_BYTES})")
    if path is None:
        return number(_text(raw)), None
    document = _document(raw)
    value = number(field(document, path))
    return value, None if time_path is None else timestamp(field(document, time_path))


def number(value: object) -> float:
    """A JSON number, or a string holding one, as a finite float32-representable float."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise BadReading("not_a_number", f"{_short(value)} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadReading("not_a_number", f"{_short(value)} is not a number")
    try:
        value = float(value)
    except OverflowError:
        raise BadReading("not_finite", "an integer beyond float range") from None
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        raise BadReading("not_finite", f"{value!r} is not a finite float32")
    return value


def field(document: object, path: str) -> object:
    """The item at a dot path (``BME280.Temperature``) of nested JSON objects."""
    item = document
    for name in path.split("."):
        if not isinstance(item, dict) or name not in item:
            raise BadReading("missing_field", f"no {path!r} in the payload")
        item = item[name]
    return item


def timestamp(value: object) -> int:
    """UTC nanoseconds from an ISO 8601 string (no zone: UTC; ``datetime.fromisoformat``, to the
    microsecond) or unix seconds/milliseconds."""
    try:
        if isinstance(value, str) and _ISO_DATE.match(value.strip()):
            return from_datetime(datetime.fromisoformat(value.strip()))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return from_unix(value, NS_PER_S if abs(value) < _MILLISECONDS_FROM else NS_PER_S // 1_000)
        raise ValueError("not an ISO 8601 date-time or unix time")
    except (ValueError, OverflowError) as err:
        raise BadReading("bad_timestamp", f"{_short(value)}: {str(err)[:_SHOWN]}") from None


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadReading("not_a_number", "payload is not UTF-8 text") from None


def _document(raw: bytes) -> object:
    """Parse JSON, refusing deep nesting by a linear scan before the parser sees it."""
    if json_depth(raw) > MAX_JSON_DEPTH:
        raise BadReading("too_large", f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, ValueError) as err:
        raise BadReading("not_a_number", f"payload is not JSON ({str(err)[:_SHOWN]})") from None


def _short(value: object) -> str:
    """A value for a log line, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."
