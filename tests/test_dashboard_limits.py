"""The dashboard under abuse (issues 27 and 46): idle connections cannot lock it out (waitress's
own connection limit and idle timeout), and wrong tokens are throttled per source address with 429
and Retry-After while the right token always passes, and another source is unaffected; behind a
trusted reverse proxy the source is the client it forwards for."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from coordinator.observe.service import Observer
from coordinator.observe.settings import HttpSettings
from coordinator.store import Store
from coordinator.throttle import RateLimit
from tests.test_observe import TOKEN, recorded_store

OTHER_SOURCE = "127.0.0.2"  # another loopback address: another source to the server on 127.0.0.1


@contextmanager
def dashboard(folder: Path, **limits: object) -> Iterator[tuple[str, int]]:
    """A coordinator's dashboard (real waitress, real store) with a token and ``limits``."""
    recorded_store(folder)
    observer = Observer(HttpSettings(port=0, token=TOKEN, **limits), lambda: Store(folder), "test", rounds=5,
                        min_clients=1)
    observer.start("campaign-1")
    try:
        host, port = observer.server.address.rsplit(":", 1)
        yield host, int(port)
    finally:
        observer.stop()


def request(address: tuple[str, int], token: str, source: str = "127.0.0.1", timeout: float = 10,
            forwarded_for: str | None = None) -> http.client.HTTPResponse:
    """GET /api/round with ``token`` from the loopback address ``source`` (as a proxy forwarding for
    ``forwarded_for``, when given)."""
    connection = http.client.HTTPConnection(*address, timeout=timeout, source_address=(source, 0))
    forwarding = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    connection.request("GET", "/api/round", headers={"Authorization": f"Bearer {token}", **forwarding})
    response = connection.getresponse()
    response.read()
    connection.close()
    return response


def idle_sockets(stack: ExitStack, address: tuple[str, int], count: int) -> list[socket.socket]:
    """``count`` TCP connections that never send a byte (closed with ``stack``)."""
    return [stack.enter_context(socket.create_connection(address, timeout=10)) for _ in range(count)]


def test_200_idle_connections_do_not_lock_out_a_valid_request(tmp_path: Path) -> None:
    with dashboard(tmp_path) as address, ExitStack() as stack:
        idle_sockets(stack, address, 200)
        started = time.monotonic()
        assert request(address, TOKEN, timeout=5).status == 200
        assert time.monotonic() - started < 2


def test_past_the_connection_limit_idle_connections_are_closed_and_a_request_gets_through(tmp_path: Path) -> None:
    """30 idle connections against a limit of 10: the extra ones wait in the backlog, the idle
    ones are closed after idle_timeout_s, and a valid request is served within a few seconds."""
    with dashboard(tmp_path, connection_limit=10, idle_timeout_s=1) as address, ExitStack() as stack:
        first = idle_sockets(stack, address, 30)[0]
        started = time.monotonic()
        assert request(address, TOKEN, timeout=10).status == 200
        assert time.monotonic() - started < 8
        first.settimeout(5)
        assert first.recv(1) == b"", "the server closed the idle connection"


def test_wrong_tokens_are_throttled_per_source_until_the_window_passes(tmp_path: Path) -> None:
    with dashboard(tmp_path, failed_tokens=RateLimit(burst=3, every_s=2.0)) as address:
        wrong = "0123456789abcdef-wrong"
        assert [request(address, wrong).status for _ in range(3)] == [401] * 3
        throttled = request(address, wrong)
        assert throttled.status == 429 and 1 <= int(throttled.getheader("Retry-After")) <= 2
        assert request(address, TOKEN).status == 200, "the right token is never locked out"
        assert request(address, wrong).status == 429
        assert request(address, TOKEN, OTHER_SOURCE).status == 200
        assert request(address, wrong, OTHER_SOURCE).status == 401
        time.sleep(int(throttled.getheader("Retry-After")))
        assert request(address, wrong).status == 401


def test_behind_a_trusted_proxy_a_guesser_locks_out_only_itself(tmp_path: Path) -> None:
    """Every request comes from the proxy's address: wrong tokens count against the client it
    forwards for (the last hop, which the proxy appends), so Prometheus behind the same proxy keeps
    its access, and a forged hop the guesser puts first changes nothing."""
    with dashboard(tmp_path, failed_tokens=RateLimit(burst=2, every_s=60.0), trusted_proxy="127.0.0.1") as address:
        wrong, guesser, prometheus = "0123456789abcdef-wrong", "203.0.113.7", "198.51.100.2"
        assert [request(address, wrong, forwarded_for=guesser).status for _ in range(2)] == [401] * 2
        assert request(address, wrong, forwarded_for=f"192.0.2.1, {guesser}").status == 429
        assert request(address, wrong, forwarded_for=prometheus).status == 401
        assert request(address, TOKEN, forwarded_for=prometheus).status == 200
        assert request(address, TOKEN, forwarded_for=guesser).status == 200
