"""Prometheus metrics of a coordinator: counters and histograms fed by its events (``on_event``),
gauges read from the dashboard's snapshot of the store when scraped. One registry per
coordinator (not prometheus-client's global one), so several can live in one process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DURATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, float("inf"))


class EventMetrics:
    """Turns the coordinator's events into counters and round-timing histograms."""

    def __init__(self, registry: CollectorRegistry, min_clients: int):
        self.min_clients = min_clients
        self._lock = threading.Lock()
        self._announced: dict[int, float] = {}  # round -> when it was announced (this process)
        self._accepted: dict[int, int] = {}  # round -> on-time updates accepted so far
        self.accepted = Counter("edgefl_updates_accepted", "On-time updates accepted", registry=registry)
        self.late = Counter("edgefl_updates_late", "Updates stored after their round closed (twin history), "
                            "by code", ["code"], registry=registry)
        self.rejected = Counter("edgefl_messages_rejected", "Messages refused (hello, update, status), by reason "
                                "code", ["code"], registry=registry)
        self.throttled = Counter("edgefl_messages_throttled", "Messages dropped unread over a client's rate limit "
                                 "(intake), by kind", ["kind"], registry=registry)
        self.registered = Counter("edgefl_registrations", "Hellos accepted (registrations and re-registrations)",
                                  registry=registry)
        self.ingested_bytes = Counter("edgefl_ingested_bytes", "Payload bytes received from the broker",
                                      registry=registry)
        self.ingested_messages = Counter("edgefl_ingested_messages", "Messages received from the broker",
                                         registry=registry)
        self.closed = Counter("edgefl_rounds_closed", "Rounds aggregated", registry=registry)
        self.imputed = Counter("edgefl_clients_imputed", "Missing clients imputed by their twins", registry=registry)
        self.loss = Gauge("edgefl_round_loss", "Mean training loss reported in the last closed round",
                          registry=registry)
        self.duration = Histogram("edgefl_round_duration_seconds", "Announcement to close of a round",
                                  buckets=DURATION_BUCKETS, registry=registry)
        self.quorum = Histogram("edgefl_time_to_quorum_seconds", "Announcement to the min_clients-th on-time update",
                                buckets=DURATION_BUCKETS, registry=registry)
        self._dispatch = self._handlers()

    def __call__(self, kind: str, data: dict) -> None:
        handler = self._dispatch.get(kind)
        if handler is not None:
            with self._lock:
                handler(data)

    def _handlers(self) -> dict[str, Callable[[dict], None]]:
        return {"announced": self._on_announced, "accepted": self._on_accepted, "resumed": self._on_resumed,
                "closed": self._on_closed, "registered": lambda _d: self.registered.inc(),
                "rejected": lambda d: self.rejected.labels(d["code"]).inc(),
                "throttled": lambda d: self.throttled.labels(d["kind"]).inc(d["count"]),
                "late": lambda d: self.late.labels(d["code"]).inc(), "ingested": self._on_ingested}

    def _on_announced(self, data: dict) -> None:
        if not data["finished"]:
            self._announced.setdefault(data["round"], time.monotonic())

    def _on_resumed(self, data: dict) -> None:
        self._accepted[data["round"]] = len(data["accepted"])

    def _on_accepted(self, data: dict) -> None:
        self.accepted.inc()
        number = data["round"]
        self._accepted[number] = self._accepted.get(number, 0) + 1
        if self._accepted[number] == self.min_clients and number in self._announced:
            self.quorum.observe(time.monotonic() - self._announced[number])

    def _on_closed(self, data: dict) -> None:
        number = data["round"]
        self.closed.inc()
        self.imputed.inc(len(data["imputed"]))
        self.loss.set(data["loss"])
        if number in self._announced:
            self.duration.observe(time.monotonic() - self._announced.pop(number))
        self._accepted.pop(number, None)

    def _on_ingested(self, data: dict) -> None:
        self.ingested_messages.inc(data["messages"])
        self.ingested_bytes.inc(data["bytes"])


class SnapshotGauges(Collector):
    """Gauges read on scrape from the dashboard's (cached) snapshot of the store."""

    def __init__(self, snapshot: Callable[[], dict]):
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        view = self._snapshot()
        current = view["round"] or {"round": 0, "reported": []}
        clients = view["clients"]
        yield _gauge("edgefl_round", "Current round (the open one, or the last when finished)", current["round"])
        yield _gauge("edgefl_round_reported", "On-time updates in the open round", len(current["reported"]))
        yield _gauge("edgefl_clients_registered", "Clients that have registered", len(clients))
        yield _gauge("edgefl_clients_online", "Registered clients whose presence is online",
                     sum(c["online"] for c in clients))
        yield _gauge("edgefl_store_bytes", "Bytes of the coordinator's state in its database (measured every 30 s)",
                     view["store_bytes"])


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
