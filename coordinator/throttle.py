"""Rate limits with a token bucket per key: one mechanism for the coordinator's intake (per
client and message kind) and the dashboard's failed tokens (per source address).

A key starts with ``burst`` tokens and earns one every ``every_s`` seconds up to ``burst``; an
action that finds no token is refused. Memory is bounded: buckets that refilled completely
hold nothing a fresh one would not and are forgotten, and past ``max_keys`` the least recently
used key is dropped first."""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MAX_KEYS = 100_000


class RateLimit(BaseModel):
    """``burst`` actions at once, then one per ``every_s`` seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    burst: int = Field(ge=1, le=1_000_000, description="actions allowed at once (the bucket's size)")
    every_s: float = Field(gt=0, le=86_400, description="seconds to earn back one action")


@dataclass
class _Bucket:
    tokens: float
    at: float


class Buckets:
    """A token bucket per key under one ``RateLimit``; safe to share between threads."""

    def __init__(self, limit: RateLimit, max_keys: int = DEFAULT_MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic):
        self.limit, self.max_keys, self.clock = limit, max_keys, clock
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: Hashable) -> bool:
        """Spend one of ``key``'s tokens: False (and nothing spent) when it has none."""
        with self._lock:
            bucket = self._refilled(key)
            if bucket.tokens < 1:
                return False
            bucket.tokens -= 1
            return True

    def wait_s(self, key: Hashable) -> float:
        """Seconds until ``key`` has a token again (0: it has one now)."""
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            return max(0.0, (1 - self._refilled(key).tokens) * self.limit.every_s)

    def forget_full(self) -> None:
        """Drop the buckets that refilled to ``burst`` (idle keys)."""
        with self._lock:
            now, limit = self.clock(), self.limit
            idle = [k for k, b in self._buckets.items() if b.tokens + (now - b.at) / limit.every_s >= limit.burst]
            for key in idle:
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)

    def _refilled(self, key: Hashable) -> _Bucket:
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._buckets.popitem(last=False)
            bucket = self._buckets[key] = _Bucket(float(self.limit.burst), now)
        else:
            self._buckets.move_to_end(key)
        bucket.tokens = min(float(self.limit.burst), bucket.tokens + (now - bucket.at) / self.limit.every_s)
        bucket.at = now
        return bucket


class IntakeLimits(BaseModel):
    """``[intake]`` of ``coordinator.toml``: how many hellos and updates one client may send before
    the coordinator drops the rest unread. Presence (``status``) is not limited: it is idempotent,
    writes no event row, and a dropped one could leave a client's presence wrong."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hello: RateLimit = Field(RateLimit(burst=10, every_s=5.0), description="hellos per client: an agent says "
                             "hello on (re)connect, when the coordinator comes online and when its data grew")
    update: RateLimit = Field(RateLimit(burst=20, every_s=1.0), description="updates per client: one per round "
                              "from an honest agent, plus re-sends after a reconnect")
    report_every_s: float = Field(60.0, gt=0, le=86_400, description="how often the dropped messages are written "
                                  "to the event log: one row per client and kind, with the count")


@dataclass(frozen=True)
class Dropped:
    """``count`` messages of ``kind`` from ``client`` dropped over the last ``over_s`` seconds."""

    client: str
    kind: str
    count: int
    over_s: float


class IntakeThrottle:
    """The intake's rate limits: ``admit`` per message (a dictionary lookup, nothing stored),
    ``report`` the drops once per ``report_every_s``."""

    def __init__(self, limits: IntakeLimits, clock: Callable[[], float] = time.monotonic):
        self.limits, self.clock = limits, clock
        self.buckets = {kind: Buckets(getattr(limits, kind), clock=clock) for kind in ("hello", "update")}
        self._dropped: Counter[tuple[str, str]] = Counter()
        self._since = clock()

    def admit(self, client: str, kind: str) -> bool:
        """Whether a ``kind`` message of ``client`` may be handled; a refused one is counted."""
        buckets = self.buckets.get(kind)
        if buckets is None or buckets.take(client):
            return True
        self._dropped[client, kind] += 1
        return False

    def report(self) -> list[Dropped]:
        """Once ``report_every_s`` has passed since the last report: the drops since then, by
        client and kind (idle buckets forgotten); before that, nothing."""
        now = self.clock()
        if now - self._since < self.limits.report_every_s:
            return []
        dropped = [Dropped(client, kind, count, now - self._since) for (client, kind), count in self._dropped.items()]
        self._dropped.clear()
        self._since = now
        for buckets in self.buckets.values():
            buckets.forget_full()
        return dropped
