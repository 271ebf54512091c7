"""The fleet's state as plain JSON-ready data, read on the dashboard's own Store connection
(never the round loop's), rebuilt at most every ``ttl`` seconds and shared by every request.

Closed rounds never change, so their summaries are read once; the open round, the clients and
the rejection log are read per rebuild. The rebuild interval grows with its cost (five times the
last build), so a large state cannot keep a core busy however often the page polls."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from coordinator.store import RoundRow, Store, UpdateRow
from edge_agent.candidates import fleet_quality, quality

RECENT_REJECTIONS = 20
REJECTING_CLIENTS = 100  # the most-refused clients listed (the total counts all)
STORE_SIZE_EVERY_S = 30.0


class FleetView:
    """Snapshots of one coordinator's state for the dashboard, the JSON API and the gauges."""

    def __init__(self, open_store: Callable[[], Store], fleet: str, campaign: str, rounds: int, min_clients: int,
                 ttl: float = 1.0):
        self._open_store = open_store
        self._store: Store | None = None
        self.about = {"fleet": fleet, "campaign": campaign, "total_rounds": rounds, "min_clients": min_clients}
        self.ttl = ttl
        self._lock = threading.Lock()
        self._snapshot: dict | None = None
        self._expires = 0.0
        self._closed: dict[int, dict] = {}  # summaries of closed rounds, read once
        self._store_bytes = (0, 0.0)  # (bytes, when measured)

    def snapshot(self) -> dict:
        """The current snapshot, rebuilt when it is older than its interval (one reader at a time)."""
        with self._lock:
            if self._snapshot is None or time.monotonic() >= self._expires:
                started = time.monotonic()
                self._snapshot = self._build()
                cost = time.monotonic() - started
                self._snapshot["build_seconds"] = round(cost, 4)
                self._expires = time.monotonic() + max(self.ttl, 5 * cost)
            return self._snapshot

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.close()
                self._store = None

    def _build(self) -> dict:
        if self._store is None:
            self._store = self._open_store()
        store = self._store
        latest = store.latest_round()
        rounds = self._round_summaries(store, latest)
        recent = Recent.read(store, latest, rounds[-1]["round"] if rounds else None)
        current = self._current_round(store, latest, recent)
        return {**self.about, "generated_at": time.time(), "store_bytes": self._state_size(store),
                "round": current, "rounds": rounds, "clients": self._clients(store, recent, rounds),
                "rejections": self._rejections(store)}

    def _round_summaries(self, store: Store, latest: RoundRow | None) -> list[dict]:
        last = 0 if latest is None else latest.round
        for number in range(1, last + 1):
            if number not in self._closed:
                row = latest if number == last else store.round(number)
                if row.closed_at is None:
                    break
                self._closed[number] = self._summary(store, row)
        return [self._closed[n] for n in sorted(self._closed)]

    @staticmethod
    def _summary(store: Store, row: RoundRow) -> dict:
        metrics = row.metrics
        return {"round": row.round, "opened_at": row.opened_at, "closed_at": row.closed_at,
                "seconds": round(row.closed_at - row.opened_at, 3), "loss": _finite(metrics.get("loss")),
                "clients": len(metrics.get("clients", [])), "imputed": metrics.get("imputed", []),
                "dropped": metrics.get("dropped", []), "rejected": sorted(metrics.get("rejected", {})),
                "twin": metrics.get("twin"), "closed_by": metrics.get("closed_by"),
                "update_bytes": store.update_bytes(row.round),
                "validation": fleet_quality([update.metrics for update in store.updates(row.round)])}

    def _current_round(self, store: Store, latest: RoundRow | None, recent: "Recent") -> dict | None:
        if latest is None:
            return None
        return {"round": latest.round, "open": latest.closed_at is None, "opened_at": latest.opened_at,
                "deadline": latest.deadline, "reported": [u.client_id for u in recent.open],
                "finished": latest.closed_at is not None and latest.round >= self.about["total_rounds"],
                "update_bytes": store.update_bytes(latest.round)}

    @staticmethod
    def _clients(store: Store, recent: "Recent", rounds: list[dict]) -> list[dict]:
        reported = {u.client_id for u in recent.open}
        outcome = recent.outcome(rounds[-1]) if rounds else {}
        last, metrics = store.last_reported(), recent.metrics()
        rows = []
        for client in sorted(store.clients().values(), key=lambda c: c.client_id):
            name = client.client_id
            rows.append({
                "client": name, "features": client.n_features, "samples": client.n_samples,
                "latitude": client.latitude, "longitude": client.longitude, "online": client.online,
                "last_seen": client.last_seen, "last_round": last.get(name), "reported": name in reported,
                "state": "offline" if not client.online else outcome.get(name, "online"),
                **_serves(metrics.get(name, {})),
            })
        return rows

    @staticmethod
    def _rejections(store: Store) -> dict:
        """Counts grouped in the database (the log grows with every refusal; a hostile device
        can make it long) and the newest few refusals."""
        by_code, by_client = store.refusal_counts("code"), store.refusal_counts("client_id", REJECTING_CLIENTS)
        return {"total": sum(by_code.values()), "by_code": by_code,
                "by_client": {client or "-": count for client, count in by_client.items()},
                "recent": store.recent_refusals(RECENT_REJECTIONS)}

    def _state_size(self, store: Store) -> int:
        size, measured = self._store_bytes
        if time.monotonic() - measured >= STORE_SIZE_EVERY_S or not measured:
            self._store_bytes = size, measured = store.size_bytes(), time.monotonic()
        return size


@dataclass(frozen=True)
class Recent:
    """The updates one snapshot needs, read once: the open round's (on time) and the newest
    closed round's (late ones included)."""

    open: list[UpdateRow]
    closed: list[UpdateRow]
    closed_on_time: set[str]

    @classmethod
    def read(cls, store: Store, latest: RoundRow | None, closed: int | None) -> "Recent":
        is_open = latest is not None and latest.closed_at is None
        return cls(store.updates(latest.round) if is_open else [],
                   store.updates(closed, include_late=True) if closed else [],
                   {u.client_id for u in store.updates(closed)} if closed else set())

    def outcome(self, closed: dict) -> dict[str, str]:
        """What the newest closed round did with each client: imputed, dropped, or its update came late."""
        late = {u.client_id for u in self.closed} - self.closed_on_time
        return {**{c: "dropped" for c in closed["dropped"]}, **{c: "imputed" for c in closed["imputed"]},
                **{c: "late" for c in late}}

    def metrics(self) -> dict[str, dict]:
        """Each client's metrics from its newest update of these two rounds."""
        return {u.client_id: u.metrics for u in (*self.closed, *self.open)}


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such a loss is shown as missing."""
    return value if value is not None and math.isfinite(value) else None


def _serves(metrics: dict) -> dict:
    """Which model the gateway said it serves (federated, local or an anchor; only gateways that
    choose among several say), its validation MASE and its best anchor's."""
    row = quality(metrics) or {}
    return {"serves": row.get("serves"), "served_mase": row.get("served"), "best_anchor": row.get("best_anchor"),
            "anchor_mase": row.get("anchor")}
