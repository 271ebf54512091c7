"""Readings of the gateway's own sensors, from its local MQTT broker into a bounded store, and
from the store into the model's table.

Besides the payload kinds (``edge_agent.sensors.payloads``), a reading is refused as:

- ``too_old``: stamped before the retention window (``retention_days`` before its arrival);
- ``in_future``: stamped more than ``max_future_s`` after its arrival;
- ``out_of_order``: not after the newest stored reading of its feature (also a duplicate);
- ``retained``: a retained message for a feature without ``time_path``: the broker replays the
  last value on every subscribe, and its arrival time is not the time it was measured;
- ``unknown_topic``: a message on a topic no feature maps (say, queued for an earlier session with
  other subscriptions), counted under ``UNKNOWN_TOPIC``;
- ``error``: anything unexpected (a full disk, a locked database), logged with its traceback.

Each kind is logged once per feature as a warning and counted always (``counts()``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import paho.mqtt.client as mqtt

from edge_agent.data.errors import DataError
from edge_agent.data.gaps import GapPolicy, fill_gaps, runs
from edge_agent.mqtt import Connection
from edge_agent.sensors.payloads import BadReading, read
from edge_agent.sensors.settings import SensorFeature, SensorSettings
from edge_agent.sensors.store import ReadingStore
from edge_agent.times import duration_text, now_ns, text_ns, to_ns

if TYPE_CHECKING:
    from edge_agent.data.table import SeriesTable

log = logging.getLogger(__name__)
UNKNOWN_TOPIC = "(unknown topic)"
_MAX_LISTED = 3
_FILL_HINT = "to skip or fill them, set data.gaps.fill to skip, ffill or interpolate in agent.toml"


Moment = int | datetime  # UTC nanoseconds, or a datetime (naive: UTC)


@dataclass(frozen=True)
class Grid:
    """The stored readings on the step's grid: each row the means of one interval (NaN: none)."""

    start_ns: int
    step_ns: int
    values: np.ndarray  # (intervals, features) float64
    columns: list[str]

    @property
    def times_ns(self) -> np.ndarray:
        """Each row's interval start (int64 UTC nanoseconds)."""
        return self.start_ns + self.step_ns * np.arange(len(self.values), dtype=np.int64)


class SensorIngest:
    """Subscribes to each feature's topic at QoS 1 and stores every valid reading."""

    def __init__(self, settings: SensorSettings, state_dir: Path, client_id: str = "edgefl"):
        """``client_id``: the agent's; the sensor client connects as ``<client_id>-sensors`` with a
        persistent session, so readings published while the agent is down arrive when it is back."""
        self.settings = settings
        self.client_id = f"{client_id}-sensors"
        self.status_topic = f"edgefl/{self.client_id}/status"
        self.store = ReadingStore(settings.store_path(state_dir), settings.retention_ns,
                                  settings.max_readings_per_feature)
        self._topics: dict[str, list[SensorFeature]] = {}
        for feature in settings.features:
            self._topics.setdefault(feature.topic, []).append(feature)
        self._connection: Connection | None = None

    def start(self) -> None:
        """Connect to the local broker in the background; ``online`` (retained) on the status topic."""
        connection = Connection(self.settings.broker, self.client_id, self.status_topic, list(self._topics))
        connection.client.on_message = self._on_message
        connection.on_connected.append(lambda: connection.publish(self.status_topic, b"online", retain=True))
        connection.start()
        self._connection = connection

    def stop(self) -> None:
        """Disconnect (``offline`` on the status topic) and close the store."""
        if self._connection is not None:
            self._connection.stop(self.status_topic)
            self._connection = None
        self.store.close()

    def publish(self, topic: str, payload: bytes, retain: bool) -> None:
        """Publish on the local broker (QoS 1) and wait up to 5 s for it to leave (forecasts)."""
        if self._connection is None:
            raise RuntimeError("the sensor client is not started")
        self._connection.publish(topic, payload, retain=retain).wait_for_publish(5)

    @property
    def connected(self) -> bool:
        """True while the client is connected to the local broker (its subscriptions sent)."""
        return self._connection is not None and self._connection.connected.is_set()

    def handle(self, topic: str, payload: bytes, arrival: Moment | None = None, retained: bool = False) -> None:
        """Validate and store one message for every feature its topic carries; never raises.
        ``arrival``: when it arrived (default now)."""
        arrival = now_ns() if arrival is None else to_ns(arrival)
        features = self._topics.get(topic)
        if features is None:
            self._refuse(UNKNOWN_TOPIC, BadReading("unknown_topic", f"no feature reads {topic!r}"))
        for feature in features or ():
            try:
                self._accept(feature, payload, arrival, retained)
            except BadReading as bad:
                self._refuse(feature.name, bad)
            except Exception:
                if self.store.refused(feature.name, "error") == 1:
                    log.exception("sensor %s: reading on %s not stored; further errors are only counted",
                                  feature.name, topic)

    def counts(self) -> dict[str, dict[str, int]]:
        """feature -> kind (``accepted`` or a refusal kind) -> count since this ingest started."""
        return self.store.counts()

    def grid(self, name: str, now: Moment | None = None) -> Grid:
        """The features (in configured order) on the step's grid, each cell the mean of the readings
        in [t, t + step) labelled t (intervals aligned to the unix epoch). Only complete intervals,
        from the first with a reading to the last with one before the one holding ``now`` (the
        hours since the newest reading are no history yet); intervals without a reading are NaN."""
        step = self.settings.step_ns
        now = now_ns() if now is None else to_ns(now)
        self.store.prune(now)
        columns = [feature.name for feature in self.settings.features]
        means = self.store.means(columns, step, now // step * step)
        if not means:
            raise DataError(f"{name}: no sensor reading yet in a complete interval of {duration_text(step)} "
                            f"before {text_ns(now)}")
        first = min(interval for _, interval, _ in means)
        end = max(interval for _, interval, _ in means) + 1
        values = np.full((end - first, len(columns)), np.nan)
        position = {column: j for j, column in enumerate(columns)}
        for feature, interval, mean in means:
            values[interval - first, position[feature]] = mean
        return Grid(first * step, step, values, columns)

    def window(self, name: str, rows: int, gaps: GapPolicy = GapPolicy(),
               now: Moment | None = None) -> tuple[np.ndarray, np.ndarray] | None:
        """The latest ``rows`` intervals as (times ns, float32 values (rows, F), as a table holds them),
        their gaps filled as ``gaps`` allows (as ``table`` does), or None where one of them still
        lacks a value: what a forecast reads, with numpy alone."""
        grid = self.grid(name, now)
        filled, _ = fill_gaps(grid.values, gaps)
        if len(filled) < rows or np.isnan(filled[-rows:]).any():
            return None
        return grid.times_ns[-rows:], filled[-rows:].astype(np.float32)

    def rows(self, name: str, gaps: GapPolicy = GapPolicy(), now: Moment | None = None) -> int:
        """The intervals of history ``table`` would hold, refusing what it refuses, with numpy
        alone: what the training agent checks before a child builds a learner on it."""
        grid = self.grid(name, now)
        _refuse_gaps(name, grid, gaps)
        return len(grid.values)

    def table(self, name: str, gaps: GapPolicy = GapPolicy(), now: Moment | None = None) -> SeriesTable:
        """The ``grid`` as the model's table (naive UTC times), its gaps refused, kept or filled as
        ``gaps`` says (like empty cells of a CSV file). Training's view: it needs pandas."""
        import pandas as pd

        from edge_agent.data.table import SeriesTable

        grid = self.grid(name, now)
        _refuse_gaps(name, grid, gaps)
        step = pd.Timedelta(grid.step_ns)
        index = pd.date_range(pd.Timestamp(grid.start_ns), periods=len(grid.values), freq=step, unit="ns")
        return SeriesTable.on_grid(name, index, grid.values, grid.columns, step, gaps)

    def _accept(self, feature: SensorFeature, payload: bytes, arrival: int, retained: bool) -> None:
        if retained and feature.time_path is None:
            raise BadReading("retained", "a retained message without a timestamp of its own")
        value, stamp = read(payload, feature.path, feature.time_path)
        stamp = arrival if stamp is None else stamp
        ahead = (stamp - arrival) / 1e9
        if ahead > self.settings.max_future_s:
            raise BadReading("in_future", f"{text_ns(stamp)} is {ahead:.0f} s after its arrival at {text_ns(arrival)}")
        self.store.add(feature.name, stamp, value, arrival)

    def _refuse(self, feature: str, bad: BadReading) -> None:
        if self.store.refused(feature, bad.kind) == 1:
            log.warning("sensor %s: reading refused (%s); further %s readings are only counted",
                        feature, bad, bad.kind)

    def _on_message(self, _client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        self.handle(message.topic, bytes(message.payload), retained=bool(message.retain))


def _refuse_gaps(name: str, grid: Grid, gaps: GapPolicy) -> None:
    """Under ``data.gaps.fill = "refuse"``, an interval without a reading of every feature is a
    ``DataError`` naming the first few gaps (naive UTC, as the table's index prints them)."""
    if gaps.fill != "refuse":
        return
    found = runs(np.isnan(grid.values).any(axis=1))
    if found:
        listed = ", ".join(f"{steps} intervals from {_naive(grid.start_ns + start * grid.step_ns)}"
                           for start, steps in found[:_MAX_LISTED])
        more = ", ..." if len(found) > _MAX_LISTED else ""
        raise DataError(f"{name}: {len(found)} gaps (intervals of {duration_text(grid.step_ns)} without "
                        f"a reading): {listed}{more}; {_FILL_HINT}")


def _naive(ns: int) -> str:
    """UTC nanoseconds as ``2021-01-01 03:00:00``."""
    return datetime.fromtimestamp(ns // 1_000_000_000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
