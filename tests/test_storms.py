"""A device with valid credentials storms and replays (issue 27), on a real mosquitto with a
real coordinator and an honest agent: 2,000 hellos as fast as it can send them add a bounded
number of event rows (the drops are counted per client, not logged per message) and the
honest round still closes; its round-1 update replayed in round 2 is refused as ``replay``
(verbatim: ``duplicate``) and round 2 aggregates the genuine updates only."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.store import Store
from coordinator.strategies import ClientUpdate, weighted_mean
from coordinator.throttle import IntakeLimits
from edge_agent.config import load_config
from edge_agent.learners import fleet_template
from edge_agent.protocol import HelloHeader, UpdateHeader, body_digest, decode, encode
from tests.broker import Mosquitto, free_port
from tests.fleet import SEED, agent_config, coordinator_config, exits, start, wait_for, write_client_csvs
from tests.test_hostile import HOSTILE, TOPICS, Device

STORM = 2_000
REPORT_EVERY_S = 0.5
HELLO_BURST = IntakeLimits().hello.burst


@pytest.fixture
def roomy_broker(tmp_path: Path):
    """A broker that queues the whole storm for the coordinator (mosquitto drops QoS 1 messages
    past max_queued_messages, 1000 by default), so every hello reaches the intake."""
    port = free_port()
    config = tmp_path / "broker.conf"
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages 10000\n")
    broker = Mosquitto(tmp_path / "broker", port, config).start()
    yield broker
    broker.stop()


def throttled_hellos(metrics_url: str) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    found = re.search(r'^edgefl_messages_throttled_total\{kind="hello"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def update(number: int, announced: str, tensors: dict[str, torch.Tensor], campaign: str) -> bytes:
    header = UpdateHeader(fleet="test", sender=HOSTILE, round=number, n_samples=50, campaign=campaign,
                          global_sha256=announced)
    return encode(header, tensors)


def restamped(payload: bytes, **fields: object) -> bytes:
    """The same update body under a header with ``fields`` changed (what a replaying device sends)."""
    header, tensors = decode(payload, 1 << 30)
    return encode(header.model_copy(update=fields), tensors)


def test_a_hello_storm_is_bounded_and_a_replayed_update_is_refused(tmp_path: Path, roomy_broker) -> None:
    http_port = free_port()
    config = coordinator_config(tmp_path, roomy_broker.port, 2, min_clients=2, start_clients=2, linger_s=1.0,
                                intake={"report_every_s": REPORT_EVERY_S}, http={"port": http_port})
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    path = write_client_csvs(tmp_path, 1)[0]
    agent = start(tmp_path, "agent0", "agent", "run", "-c", str(agent_config(tmp_path, roomy_broker.port, 0, path)))
    device = Device(roomy_broker.port)
    signature = fleet_template(load_config(config, CoordinatorConfig), SEED).signature
    hello = HelloHeader(fleet="test", sender=HOSTILE, n_features=1, n_samples=50, model_signature=signature)
    device.register(hello)

    started = time.monotonic()
    payload = encode(hello)
    sent = [device.client.publish(TOPICS.agent(HOSTILE, "hello"), payload, qos=1) for _ in range(STORM)]
    sent[-1].wait_for_publish(60)
    storm_s = time.monotonic() - started
    metrics = f"http://127.0.0.1:{http_port}/metrics"
    wait_for(lambda: throttled_hellos(metrics) >= STORM - HELLO_BURST, 60, "the storm's drops to be counted")

    state1 = device.round(1)
    captured = update(1, body_digest(state1), state1, device.campaign)
    device.send("update", captured)
    assert device.reply().accepted
    state2 = device.round(2)
    replays = {"verbatim": (captured, "duplicate"), "as round 2": (restamped(captured, round=2), "replay")}
    for payload, _ in replays.values():
        device.send("update", payload)
    assert [device.reply().code for _ in replays] == [code for _, code in replays.values()]
    genuine = {name: tensor + 0.001 for name, tensor in state2.items()}
    device.send("update", update(2, body_digest(state2), genuine, device.campaign))
    assert device.reply().accepted, "the refused replays did not take the device's place in round 2"
    device.send("status", b"offline")
    exits([coordinator, agent])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()

    store = Store(tmp_path / "coordinator")
    try:
        hostile = [e for e in store.events() if e["client_id"] == HOSTILE]
        hellos = [e for e in hostile if e["kind"] == "hello"]
        accepted, limited = ([e for e in hellos if e["accepted"]], [e for e in hellos if e["code"] == "rate_limited"])
        dropped = sum(int(e["reason"].split()[0]) for e in limited)
        assert accepted and limited and len(hellos) == len(accepted) + len(limited), "no other hello refusals"
        assert len(accepted) <= HELLO_BURST + 1 and len(limited) <= storm_s / REPORT_EVERY_S + 4
        assert len(accepted) + dropped >= STORM, "every hello of the storm was either handled or counted"
        assert sorted(e["code"] for e in hostile if e["kind"] == "update" and not e["accepted"]) == \
            ["duplicate", "replay"]
        rounds = store.rounds()
        assert [row.metrics["closed_by"] for row in rounds] == ["all participants reported"] * 2
        assert [row.metrics["clients"] for row in rounds] == [["client00", HOSTILE]] * 2
        kept = {u.client_id: u for u in store.updates(2)}
        assert store.load_update(kept[HOSTILE]).keys() == genuine.keys()
        assert all(torch.equal(store.load_update(kept[HOSTILE])[k], genuine[k]) for k in genuine)
        expected = weighted_mean([ClientUpdate(u.client_id, store.load_update(u), u.n_samples) for u in kept.values()])
        result = store.load_file(rounds[1].result_file)
        assert all(torch.allclose(result[k], expected[k]) for k in expected)
    finally:
        store.close()
    assert "Traceback" not in (tmp_path / "coordinator.log").read_text()
