"""Times and durations as int64 nanoseconds since the unix epoch (UTC), with the standard library
alone: the sensor ingest and the serving-only process keep their clocks without pandas."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta, timezone

NS_PER_S = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_INT64_MAX = 2**63 - 1
_UNIT_NS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": NS_PER_S, "min": 60 * NS_PER_S, "h": 3_600 * NS_PER_S,
            "d": 86_400 * NS_PER_S, "w": 604_800 * NS_PER_S}
_UNIT_NAMES = {"ns": ("nanosecond", "nanoseconds"), "us": ("microsecond", "microseconds"),
               "ms": ("millisecond", "milliseconds"), "s": ("sec", "second", "seconds"),
               "min": ("minute", "minutes"), "h": ("hour", "hours", "hr"), "d": ("day", "days"),
               "w": ("week", "weeks")}
_UNITS = {name.lower(): unit for unit, names in _UNIT_NAMES.items() for name in (unit, *names)}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]+)")


def now_ns() -> int:
    """The current UTC time."""
    return time.time_ns()


def to_ns(moment: int | datetime) -> int:
    """Nanoseconds of an int (as is) or a datetime (naive: UTC already; pandas' Timestamps included)."""
    if isinstance(moment, int):
        return moment
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
    return (aware - _EPOCH) // timedelta(microseconds=1) * 1_000 + getattr(moment, "nanosecond", 0)


def from_datetime(moment: datetime) -> int:
    """``to_ns`` of a parsed datetime, refused (ValueError) outside the int64 nanosecond range."""
    ns = to_ns(moment)
    if not -_INT64_MAX <= ns <= _INT64_MAX:
        raise ValueError(f"{moment} is outside the range of nanosecond timestamps (1677-2262)")
    return ns


def from_unix(value: float, unit_ns: int) -> int:
    """A unix time in units of ``unit_ns`` nanoseconds as nanoseconds; out of range is a ValueError."""
    ns = value * unit_ns if isinstance(value, int) else round(value * unit_ns)
    if not -_INT64_MAX <= ns <= _INT64_MAX:
        raise ValueError(f"{value} is outside the range of nanosecond timestamps (1677-2262)")
    return int(ns)


def parse_duration(text: str) -> int:
    """A duration such as '1h', '15min', '30s', '1h30min' or '2 days' in nanoseconds (the unit names
    pandas' Timedelta reads; ValueError for anything else)."""
    total, position = 0, 0
    for part in _PART.finditer(text):
        if part.start() != position or part.group(2).lower() not in _UNITS:
            break
        total += round(float(part.group(1)) * _UNIT_NS[_UNITS[part.group(2).lower()]])
        position = part.end()
    if position == 0 or text[position:].strip():
        raise ValueError(f"{text!r} is not a duration such as '1h', '15min', '30s' or '1h30min'")
    return total


def text_ns(ns: int) -> str:
    """Nanoseconds as an ISO 8601 UTC time for messages, to the microsecond."""
    return (_EPOCH + timedelta(microseconds=ns // 1_000)).isoformat().replace("+00:00", "Z")


def iso(moment: datetime) -> str:
    """A moment as ISO 8601 UTC to the second (what forecasts carry)."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ns(ns: int) -> str:
    """Epoch nanoseconds (the table's naive UTC times) as ISO 8601 UTC to the second."""
    return iso(datetime.fromtimestamp(ns // NS_PER_S, timezone.utc))


def duration_text(ns: int) -> str:
    """A duration as Python prints a timedelta: '1:00:00', '0:30:00', '31 days, 0:00:00'."""
    return str(timedelta(microseconds=ns // 1_000))


def interval_text(interval_ns: int) -> str:
    """An interval as a setting reads it: '30min', '1h', '10min', '1d'."""
    for unit, size in (("d", _UNIT_NS["d"]), ("h", _UNIT_NS["h"]), ("min", _UNIT_NS["min"]), ("s", NS_PER_S)):
        if interval_ns % size == 0:
            return f"{interval_ns // size}{unit}"
    return f"{interval_ns}ns"
