"""The coordinator's /metrics and JSON API without a browser: a real Store (SQLite) with two
clients and a closed round, the observer's real waitress server on a free loopback port, and the
rules that keep the fleet's state private (token, loopback by default, GET only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from coordinator.observe.service import Observer
from coordinator.observe.settings import HttpSettings
from coordinator.store import Store
from edge_agent.protocol import HelloHeader

TOKEN = "0123456789abcdef-test-token"


def hello(client: str, latitude: float) -> HelloHeader:
    return HelloHeader(fleet="test", sender=client, n_features=3, n_samples=500, latitude=latitude, longitude=5.0,
                       model_signature="ab" * 8)


def recorded_store(folder: Path) -> None:
    """Round 1 closed (a accepted, b imputed), round 2 open with b's update, one refused message."""
    store = Store(folder)
    try:
        for client, latitude in (("gw-a", 52.1), ("gw-b", 48.3)):
            store.register(hello(client, latitude))
        store.open_first_round(1e12, {"w": torch.zeros(2)})
        with store.batch():
            store.save_update(1, "gw-a", 500, b"x" * 1000, "0" * 64, {"loss": 0.5})
        store.finish_round(1, {"clients": ["gw-a"], "imputed": ["gw-b"], "dropped": [], "twin": "stale",
                               "loss": 0.5, "closed_by": "deadline"}, {"w": torch.ones(2)}, 2e12)
        with store.batch():
            store.save_update(2, "gw-b", 500, b"y" * 700, "0" * 64, {"loss": 0.4})
        store.log("update", "gw-a", 2, False, "bad_magic", "not an edgefl envelope")
    finally:
        store.close()


@pytest.fixture
def observer(tmp_path: Path):
    recorded_store(tmp_path)
    observer = Observer(HttpSettings(port=0, token=TOKEN), lambda: Store(tmp_path), "test", rounds=5, min_clients=1)
    observer.start("campaign-1")
    for kind, data in [("announced", {"round": 1, "finished": False}), ("accepted", {"client": "gw-a", "round": 1}),
                       ("rejected", {"client": "gw-a", "code": "bad_magic", "reason": "x"}),
                       ("ingested", {"messages": 2, "bytes": 1234}),
                       ("closed", {"round": 1, "accepted": 1, "rejected": 1, "imputed": ["gw-b"], "loss": 0.5,
                                   "why": "deadline"})]:
        observer(kind, data)
    yield f"http://{observer.server.address}"
    observer.stop()


def get(url: str, token: str | None = TOKEN, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=body,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_metrics_count_events_and_read_gauges_from_the_store(observer: str) -> None:
    status, body = get(f"{observer}/metrics")
    text = body.decode()
    assert status == 200
    for line in ('edgefl_messages_rejected_total{code="bad_magic"} 1.0', "edgefl_updates_accepted_total 1.0",
                 "edgefl_ingested_bytes_total 1234.0", "edgefl_rounds_closed_total 1.0", "edgefl_round 2.0",
                 "edgefl_clients_registered 2.0", "edgefl_clients_online 2.0", "edgefl_round_reported 1.0",
                 "edgefl_clients_imputed_total 1.0", "edgefl_round_duration_seconds_count 1.0",
                 "edgefl_time_to_quorum_seconds_count 1.0"):
        assert line in text, line
    assert float(text.split("\nedgefl_store_bytes ")[1].split()[0]) > 1700


def test_the_api_shows_the_round_the_clients_and_the_rejections(observer: str) -> None:
    fleet = json.loads(get(f"{observer}/api/fleet")[1])
    assert fleet["total_rounds"] == 5 and fleet["round"]["round"] == 2 and fleet["round"]["reported"] == ["gw-b"]
    states = {c["client"]: (c["state"], c["reported"], c["last_round"]) for c in fleet["clients"]}
    assert states == {"gw-a": ("online", False, 1), "gw-b": ("imputed", True, 2)}
    assert [(r["round"], r["loss"], r["update_bytes"]) for r in fleet["rounds"]] == [(1, 0.5, 1000)]
    assert fleet["rejections"]["by_code"] == {"bad_magic": 1} and fleet["rejections"]["by_client"] == {"gw-a": 1}
    assert json.loads(get(f"{observer}/api/rounds?last=1&token={TOKEN}", token=None)[1])["rounds"][0]["round"] == 1


def test_the_token_guards_the_api_and_nothing_changes_state(observer: str) -> None:
    assert get(f"{observer}/api/fleet", token=None)[0] == 401
    assert get(f"{observer}/metrics", token="0123456789abcdef-wrong")[0] == 401
    assert get(f"{observer}/api/fleet?token=nope", token=None)[0] == 401
    assert get(f"{observer}/", token=None)[0] == 200  # the page itself holds no fleet data
    assert get(f"{observer}/api/fleet", method="POST")[0] == 405
    assert get(f"{observer}/api/fleet", method="POST", body=b"x" * 100_000)[0] == 413  # refused unbuffered
    assert get(f"{observer}/api/rounds?last=0")[0] == 400
    assert b"unknown parameter" in get(f"{observer}/api/clients?drop=1")[1]
    assert get(f"{observer}/api/rounds?last=1&last=2")[0] == 400
    assert get(f"{observer}/admin")[0] == 404


def test_listening_beyond_loopback_needs_a_long_token() -> None:
    with pytest.raises(ValidationError, match="reachable from the network: set a token"):
        HttpSettings(host="0.0.0.0")
    with pytest.raises(ValidationError, match="at least 16 characters"):
        HttpSettings(host="0.0.0.0", token="short")
    assert HttpSettings(host="0.0.0.0", token=TOKEN).host == "0.0.0.0"
    with pytest.raises(ValueError, match="--http 'example.org:80': .*set a token"):
        HttpSettings.parse_address("example.org:80")
    assert HttpSettings.parse_address("[::1]:9100").host == "::1"


def test_serve_refuses_an_open_address_without_a_token(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text(f'fleet = "farm"\nstate_dir = "{tmp_path / "state"}"\n')
    proc = subprocess.run([sys.executable, "-m", "edgefl.cli", "coordinator", "serve", "-c", str(config),
                           "--http", "0.0.0.0:8008"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2 and "--http '0.0.0.0:8008'" in proc.stderr and "set a token" in proc.stderr


def test_a_taken_port_stops_the_start_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        observer = Observer(HttpSettings(port=port), lambda: Store(tmp_path), "test", rounds=5, min_clients=1)
        with pytest.raises(ConnectionError, match=f"cannot listen on 127.0.0.1:{port}"):
            observer.start("campaign-1")
