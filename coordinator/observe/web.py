"""The dashboard's WSGI application: the page and its assets, the JSON API and ``/metrics``.

Read-only by construction: GET and HEAD only, no route changes state. With a token, the API and
``/metrics`` need it (``Authorization: Bearer`` or ``?token=``, compared in constant time), and
wrong tokens are rate-limited per source address (``[http] failed_tokens``: past the limit a wrong
token gets 429 with Retry-After; the right token is always accepted, so a guesser cannot lock out
the clients that hold it, and a token of 16 or more random characters cannot be guessed at any
rate). Behind a reverse proxy (``[http] trusted_proxy``) the source is the client the proxy
names in X-Forwarded-For (waitress's own proxy-header handling). The page's static files hold no fleet data and are served to anyone
who can reach the port."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
from collections.abc import Callable, Iterable
from importlib.resources import files
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from coordinator.throttle import Buckets

log = logging.getLogger("edgefl.dashboard")
MAX_QUERY_CHARS = 512
MAX_ROUNDS = 10_000
STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
          "/static/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
          "/static/dashboard.css": ("dashboard.css", "text/css; charset=utf-8")}
HEADERS = [("X-Content-Type-Options", "nosniff"), ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
           ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")]

StartResponse = Callable[..., object]


class BadRequest(ValueError):
    """A query the API refuses: the message names the parameter and the reason."""


class Throttled(Exception):
    """Too many wrong tokens from one source: answered 429, retry after ``seconds``."""

    def __init__(self, seconds: float):
        super().__init__(f"too many wrong tokens from this address: retry in {math.ceil(seconds)} s")
        self.seconds = math.ceil(seconds)


def _rounds_view(view: dict, query: dict[str, str]) -> dict:
    last = query.get("last", "100")
    if not last.isdigit() or not 1 <= int(last) <= MAX_ROUNDS:
        raise BadRequest(f"last: a whole number from 1 to {MAX_ROUNDS}, got {last[:20]!r}")
    return {"rounds": view["rounds"][-int(last):]}


API: dict[str, tuple[Callable[[dict, dict[str, str]], object], set[str]]] = {
    "/api/fleet": (lambda v, _q: v, set()),
    "/api/round": (lambda v, _q: {k: v[k] for k in ("fleet", "campaign", "total_rounds", "min_clients", "round")}, set()),
    "/api/clients": (lambda v, _q: {"clients": v["clients"]}, set()),
    "/api/rounds": (_rounds_view, {"last"}),
    "/api/rejections": (lambda v, _q: v["rejections"], set()),
}


class DashboardApp:
    """Routes GET requests to the page, the API (``API``) and the metrics of one coordinator."""

    def __init__(self, snapshot: Callable[[], dict], registry: CollectorRegistry, token: str | None,
                 failed_tokens: Buckets):
        self.snapshot = snapshot
        self.registry = registry
        self.token = token.encode() if token else None
        self.failed_tokens = failed_tokens  # per source: wrong tokens allowed before 429
        self.assets = {path: (files(__package__).joinpath("static", name).read_bytes(), kind)
                       for path, (name, kind) in STATIC.items()}

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        extra: list[tuple[str, str]] = []
        try:
            status, kind, body = self._respond(environ)
        except Throttled as err:
            status, kind, body = "429 Too Many Requests", *_json({"error": str(err)})
            extra.append(("Retry-After", str(err.seconds)))
        except BadRequest as err:
            status, kind, body = "400 Bad Request", *_json({"error": str(err)})
        except Exception:  # the dashboard must never take the coordinator down; say it failed
            log.exception("dashboard request %s failed", environ.get("PATH_INFO"))
            status, kind, body = "500 Internal Server Error", *_json({"error": "internal error (see the log)"})
        headers = [("Content-Type", kind), ("Content-Length", str(len(body))), ("Cache-Control", "no-store"),
                   *HEADERS, *extra]
        if status.startswith("405"):
            headers.append(("Allow", "GET, HEAD"))
        start_response(status, headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    def _respond(self, environ: dict) -> tuple[str, str, bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return "405 Method Not Allowed", *_json({"error": "read-only: GET only"})
        if path in self.assets:
            body, kind = self.assets[path]
            return "200 OK", kind, body
        if path != "/metrics" and path not in API:
            return "404 Not Found", *_json({"error": f"no route {path[:100]!r}", "routes": ["/metrics", *API]})
        query = _query(environ.get("QUERY_STRING", ""))
        if not self._authorized(environ, query.pop("token", None)):
            return "401 Unauthorized", *_json({"error": "missing or wrong token"})
        if path == "/metrics":
            _only(query, set(), path)
            return "200 OK", "text/plain; version=0.0.4; charset=utf-8", generate_latest(self.registry)
        render, allowed = API[path]
        _only(query, allowed, path)
        return "200 OK", *_json(render(self.snapshot(), query))

    def _authorized(self, environ: dict, query_token: str | None) -> bool:
        """Whether the request carries the token; a wrong one raises ``Throttled`` while its source
        has spent its wrong tokens, else counts against it. The right token always passes."""
        if self.token is None:
            return True
        header = environ.get("HTTP_AUTHORIZATION", "")
        offered = header[len("Bearer "):] if header.startswith("Bearer ") else query_token or ""
        if hmac.compare_digest(offered.encode("utf-8", "replace"), self.token):
            return True
        source = _source(environ)
        wait = self.failed_tokens.wait_s(source)
        if wait > 0:
            raise Throttled(wait)
        self.failed_tokens.take(source)
        return False


def _source(environ: dict) -> str:
    """Whom wrong tokens are counted against: the peer's IPv4 address, or its IPv6 /64 (what one
    site is usually given, so hopping addresses inside it does not reset the count). Behind the
    trusted proxy, waitress has already put the client it forwards for in ``REMOTE_ADDR``."""
    address = environ.get("REMOTE_ADDR", "")
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return address[:64]
    return str(ipaddress.ip_network(f"{peer}/64", strict=False)) if peer.version == 6 else address


def _query(raw: str) -> dict[str, str]:
    """The query string's parameters, each once, of bounded size."""
    if len(raw) > MAX_QUERY_CHARS:
        raise BadRequest(f"query string longer than {MAX_QUERY_CHARS} characters")
    try:
        pairs = parse_qs(raw, strict_parsing=False, max_num_fields=8)
    except ValueError as err:
        raise BadRequest(f"query string: {err}") from None
    if any(len(values) > 1 for values in pairs.values()):
        raise BadRequest("query string: a parameter given twice")
    return {name: values[0] for name, values in pairs.items()}


def _only(query: dict[str, str], allowed: set[str], path: str) -> None:
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise BadRequest(f"{path}: unknown parameter {unknown[0][:40]!r} (accepted: {sorted(allowed) or 'none'}, token)")


def _json(data: object) -> tuple[str, bytes]:
    return "application/json", json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
