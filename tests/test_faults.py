"""The parts of the fault bench (``bench/faults.py``) that need no root: the latency relay and
the loss accounting from an agent's event log."""

from __future__ import annotations

import json
import socket
import socketserver
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from faults import Ledger, Relay  # noqa: E402

from coordinator.broker_setup import free_port  # noqa: E402


class _Echo(socketserver.BaseRequestHandler):
    """Sends back whatever it receives."""

    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True


def test_the_relay_holds_every_chunk_back_each_way_and_keeps_order() -> None:
    with _EchoServer(("127.0.0.1", 0), _Echo) as echo:
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        relay = Relay(("127.0.0.1", free_port()), echo.server_address).start()
        relay.delay = 0.2
        try:
            with socket.create_connection(relay.listen, timeout=10) as client:
                started = time.monotonic()
                for chunk in (b"first ", b"second ", b"third"):
                    client.sendall(chunk)
                received = b""
                while len(received) < len(b"first second third"):
                    received += client.recv(4096)
                elapsed = time.monotonic() - started
        finally:
            relay.stop()
            echo.shutdown()
    assert received == b"first second third"
    assert 0.4 <= elapsed < 3.0  # 0.2 s out and 0.2 s back


def test_the_ledger_counts_what_was_sent_acknowledged_and_refused(tmp_path: Path) -> None:
    events = tmp_path / "agent.events.jsonl"
    lines = [
        {"event": "sent", "round": 1}, {"event": "reply", "about": "update", "round": 1, "accepted": True, "code": ""},
        {"event": "sent", "round": 2}, {"event": "reply", "about": "update", "round": 2, "accepted": False,
                                        "code": "duplicate"},
        {"event": "sent", "round": 3}, {"event": "reply", "about": "update", "round": 3, "accepted": False,
                                        "code": "not_finite"},
        {"event": "sent", "round": 4}, {"event": "reply", "about": "hello", "round": 0, "accepted": True, "code": ""},
    ]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ledger = Ledger.read(events)
    assert ledger.sent == {1, 2, 3, 4}
    assert ledger.acknowledged == {1, 2}
    assert ledger.refused == {3: "not_finite"}
