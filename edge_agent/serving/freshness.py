"""Whether a gateway's readings are current enough to publish a forecast as current: the least
recent feature's newest reading against ``[serving] stale_after`` (default: the expected reading
plus two sampling intervals). While they are not, the gateway publishes a retained stale state on
``<forecast topic>/freshness`` instead of a forecast (Home Assistant reads it as availability),
and a fresh state when readings return."""

from __future__ import annotations

import json
from dataclasses import dataclass

from edge_agent.times import NS_PER_S, duration_text, iso_ns

FRESH, STALE = "fresh", "stale"


@dataclass(frozen=True)
class Freshness:
    """The least recent feature (``sensor``) and its newest reading, seen at ``now_ns``."""

    sensor: str
    newest_ns: int
    now_ns: int
    limit_ns: int

    @property
    def age_ns(self) -> int:
        return self.now_ns - self.newest_ns

    @property
    def state(self) -> str:
        return STALE if self.age_ns > self.limit_ns else FRESH

    def describe(self) -> str:
        """'sensor temp_air: newest reading 2026-11-28T04:00:00Z, 1 day, 3:12:00 old (stale after 3:00:00)'."""
        return (f"sensor {self.sensor}: newest reading {iso_ns(self.newest_ns)}, {duration_text(self.age_ns)} old "
                f"(stale after {duration_text(self.limit_ns)})")

    def document(self) -> bytes:
        """The retained JSON of the freshness topic."""
        return json.dumps({"state": self.state, "sensor": self.sensor, "newest_reading": iso_ns(self.newest_ns),
                           "age_s": round(self.age_ns / NS_PER_S), "stale_after_s": self.limit_ns / NS_PER_S,
                           "checked_at": iso_ns(self.now_ns)}, separators=(",", ":")).encode()


def freshness(latest: dict[str, int | None], now_ns: int, limit_ns: int) -> Freshness | None:
    """The freshness of the feature whose newest reading (``latest``: feature -> UTC ns or None)
    is oldest; None while no feature has a reading (there is no forecast to withhold then)."""
    held = {name: stamp for name, stamp in latest.items() if stamp is not None}
    if not held:
        return None
    sensor = min(held, key=lambda name: held[name])
    return Freshness(sensor, held[sensor], now_ns, limit_ns)
