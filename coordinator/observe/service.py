"""The coordinator's observer: Prometheus counters fed by its events, and (with ``[http]``) the
dashboard, the JSON API and ``/metrics`` on a waitress server in a background thread.

Why waitress: a small, pure-Python, long-maintained (Pylons) WSGI server with a fixed pool of
worker threads and an event loop that buffers slow clients, so neither many nor slow browsers
can tie up more than ``threads`` threads or stall the round loop; it needs no asyncio loop beside
the coordinator's own threads (as uvicorn or aiohttp would), and prometheus-client's exposition
plugs into a plain WSGI app. ``http.server`` would start one thread per connection, unbounded.
Its own settings bound the connections: ``connection_limit`` open at once (poll, so past select's
1024 descriptors), each closed after ``channel_timeout`` without traffic, checked every second."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from waitress.server import create_server

from coordinator.observe.fleet_view import FleetView
from coordinator.observe.metrics import EventMetrics, SnapshotGauges
from coordinator.observe.settings import HttpSettings
from coordinator.observe.web import DashboardApp
from coordinator.store import Store
from coordinator.throttle import Buckets

if TYPE_CHECKING:
    from coordinator.config import CoordinatorConfig

log = logging.getLogger("edgefl.dashboard")
WORKER_THREADS = 4
MAX_HEADER_BYTES = 16_384
MAX_BODY_BYTES = 1_024  # no route takes a body; waitress refuses bigger ones (413) before buffering them
CLEANUP_INTERVAL_S = 1  # how often waitress closes the connections idle for longer than idle_timeout_s


class DashboardServer:
    """The HTTP side: serves ``DashboardApp`` from its own thread until ``stop``."""

    def __init__(self, settings: HttpSettings, view: FleetView, registry: CollectorRegistry):
        token = settings.token.get_secret_value() if settings.token else None
        app = DashboardApp(view.snapshot, registry, token, Buckets(settings.failed_tokens))
        proxy = {"trusted_proxy": settings.trusted_proxy, "trusted_proxy_count": 1,
                 "trusted_proxy_headers": {"x-forwarded-for"}} if settings.trusted_proxy else {}
        try:
            self.server = create_server(app, host=settings.host, port=settings.port, threads=WORKER_THREADS,
                                        ident="edgefl", channel_timeout=settings.idle_timeout_s,
                                        cleanup_interval=CLEANUP_INTERVAL_S, connection_limit=settings.connection_limit,
                                        asyncore_use_poll=True, max_request_header_size=MAX_HEADER_BYTES,
                                        max_request_body_size=MAX_BODY_BYTES, clear_untrusted_proxy_headers=True,
                                        **proxy)
        except OSError as err:
            raise ConnectionError(f"[http]: cannot listen on {settings.host}:{settings.port}: {err}") from None
        self.address = f"{self.server.effective_host}:{self.server.effective_port}"
        self.view = view
        self.thread = threading.Thread(target=self.server.run, name="edgefl-dashboard", daemon=True)

    def start(self) -> None:
        self.thread.start()
        log.info("dashboard on http://%s/ (metrics on /metrics)", self.address)

    def stop(self) -> None:
        """Close every connection from inside the server's loop (which then ends), then its workers.
        A loop that already ended (its trigger closed with it) is only reported."""
        try:
            self.server.trigger.pull_trigger(lambda: self.server.asyncore.close_all(self.server._map))
        except OSError as err:
            log.warning("dashboard loop had already stopped (%s, alive=%s)", err, self.thread.is_alive())
        self.thread.join(10)
        self.server.task_dispatcher.shutdown()
        self.view.close()


class Observer:
    """What a coordinator reports to operators: call it with every event; ``start`` once the
    campaign is known, ``stop`` at exit. Without ``[http]`` it only counts."""

    def __init__(self, settings: HttpSettings | None, open_store: Callable[[], Store], fleet: str, rounds: int,
                 min_clients: int):
        self.registry = CollectorRegistry()
        self.metrics = EventMetrics(self.registry, min_clients)
        self._settings = settings
        self._view_args = (open_store, fleet, rounds, min_clients)
        self.server: DashboardServer | None = None

    @classmethod
    def for_coordinator(cls, cfg: "CoordinatorConfig") -> "Observer":
        return cls(cfg.http, partial(Store, cfg.state_dir, cfg.store.url), cfg.fleet, cfg.rounds, cfg.min_clients)

    def relay(self, on_event: Callable[[str, dict], None] | None) -> Callable[[str, dict], None]:
        """An event hook that counts each event, then hands it to ``on_event``."""
        def hook(kind: str, data: dict) -> None:
            self(kind, data)
            if on_event is not None:
                on_event(kind, data)
        return hook

    def __call__(self, kind: str, data: dict) -> None:
        try:
            self.metrics(kind, data)
        except Exception:  # a metrics bug must not stop the rounds
            log.exception("metrics of the %s event failed", kind)

    def start(self, campaign: str) -> None:
        if self._settings is None:
            return
        open_store, fleet, rounds, min_clients = self._view_args
        view = FleetView(open_store, fleet, campaign, rounds, min_clients)
        self.registry.register(SnapshotGauges(view.snapshot))
        self.server = DashboardServer(self._settings, view, self.registry)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
