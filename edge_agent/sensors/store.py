"""Sensor readings in SQLite: bounded by a retention window and a per-feature cap, kept across
restarts, and the per-feature counts of accepted and refused readings (those in memory only).

One table ``readings(feature, time_ns, value)`` keyed by (feature, time_ns), in WAL mode with
``synchronous=NORMAL``: a commit per reading without an fsync each, and a reader never blocks
the writer. Times are UTC nanoseconds since the unix epoch.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from pathlib import Path

from edge_agent.sensors.payloads import BadReading
from edge_agent.times import text_ns

_SCHEMA = """CREATE TABLE IF NOT EXISTS readings (
    feature TEXT NOT NULL, time_ns INTEGER NOT NULL, value REAL NOT NULL, PRIMARY KEY (feature, time_ns)
) WITHOUT ROWID"""


class ReadingStore:
    """The readings of every feature; safe to use from the MQTT thread and the agent's thread."""

    def __init__(self, path: Path, retention_ns: int, max_per_feature: int):
        self.path, self.retention_ns, self.max_per_feature = Path(path), retention_ns, max_per_feature
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._lock = threading.Lock()
        rows = self._db.execute("SELECT feature, MAX(time_ns), COUNT(*) FROM readings GROUP BY feature").fetchall()
        self._latest = {feature: latest for feature, latest, _ in rows}
        self._stored = {feature: n for feature, _, n in rows}
        self._counts: dict[str, Counter[str]] = {}

    def add(self, feature: str, time_ns: int, value: float, now_ns: int) -> None:
        """Store one reading, refusing it (``too_old``, ``out_of_order``) unless it is inside the
        retention window before ``now_ns`` and newer than the feature's newest; then prune."""
        with self._lock:
            if time_ns < now_ns - self.retention_ns:
                raise BadReading("too_old", f"{text_ns(time_ns)} is before the retention window")
            latest = self._latest.get(feature)
            if latest is not None and time_ns <= latest:
                raise BadReading("out_of_order", f"{text_ns(time_ns)} is not after the newest stored reading "
                                                 f"({text_ns(latest)})")
            stored = self._stored.get(feature, 0) + 1
            with self._db:
                self._db.execute("INSERT INTO readings VALUES (?, ?, ?)", (feature, time_ns, value))
                stored -= self._prune(feature, now_ns, stored)
            self._latest[feature], self._stored[feature] = time_ns, stored
            self._counts.setdefault(feature, Counter())["accepted"] += 1

    def refused(self, feature: str, kind: str) -> int:
        """Count a refused reading of ``feature``; returns how many of this kind so far."""
        with self._lock:
            counter = self._counts.setdefault(feature, Counter())
            counter[kind] += 1
            return counter[kind]

    def counts(self) -> dict[str, dict[str, int]]:
        """feature -> kind (``accepted`` or a refusal kind) -> how many since this store was opened."""
        with self._lock:
            return {feature: dict(counter) for feature, counter in self._counts.items()}

    def latest(self, feature: str) -> int | None:
        """The time of the feature's newest stored reading (UTC nanoseconds), or None."""
        with self._lock:
            return self._latest.get(feature)

    def prune(self, now_ns: int) -> None:
        """Delete every feature's readings that are older than the retention window or over the cap."""
        with self._lock, self._db:
            for feature, stored in self._stored.items():
                self._stored[feature] = stored - self._prune(feature, now_ns, stored)

    def means(self, features: list[str], step_ns: int, end_ns: int) -> list[tuple[str, int, float]]:
        """(feature, interval number, mean value) of every interval [k*step, (k+1)*step) before
        ``end_ns`` that holds a reading of one of ``features``."""
        marks = ", ".join("?" * len(features))
        query = (f"SELECT feature, time_ns / ?, AVG(value) FROM readings WHERE feature IN ({marks}) AND time_ns < ? "
                 "GROUP BY feature, time_ns / ?")
        with self._lock:
            return self._db.execute(query, (step_ns, *features, end_ns, step_ns)).fetchall()

    def close(self) -> None:
        """Close the database file."""
        with self._lock:
            self._db.close()

    def _prune(self, feature: str, now_ns: int, stored: int) -> int:
        """Delete the feature's readings before the retention window, then its oldest beyond the
        cap; ``stored`` is how many it has. Returns how many were deleted."""
        gone = self._db.execute("DELETE FROM readings WHERE feature = ? AND time_ns < ?",
                                (feature, now_ns - self.retention_ns)).rowcount
        over = stored - gone - self.max_per_feature
        if over > 0:
            gone += self._db.execute(
                "DELETE FROM readings WHERE feature = ? AND time_ns < (SELECT time_ns FROM readings "
                "WHERE feature = ? ORDER BY time_ns LIMIT 1 OFFSET ?)", (feature, feature, over)).rowcount
        return gone
