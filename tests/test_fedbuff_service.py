"""The buffered round policy in the coordinator service, over a real mosquitto (issue 46): four
raw gateways, "d" a straggler whose round-1 update arrives after round 1 closed. Buffered (K = 3),
round 1 closes on the third update, and d's late update is held and folded into round 2 with its
change scaled by 1/sqrt(2); synchronous, the same update is not used (d was never on time) and
round 2 waits for its deadline. Every step waits on the coordinator's messages, not on sleeps.
With real agents, a buffered fleet's rounds equal the simulation of the arrivals it recorded."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from coordinator.config import CoordinatorConfig
from coordinator.strategy_settings import BufferSettings, ParticipationSettings
from coordinator.store import Store
from edge_agent.config import load_config
from edge_agent.learners import fleet_template
from edge_agent.protocol import HelloHeader, UpdateHeader, body_digest, encode
from tests.fleet import SEED, coordinator_config, exits, start, write_client_csvs
from tests.test_hostile import Device
from tests.test_service import assert_rounds_equal, finish, replay, served_rounds, start_fleet

GATEWAYS = ("a", "b", "c", "d")
SHIFT = {"a": 0.01, "b": 0.02, "c": 0.03, "d": -0.02}


def shifted(state: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by if v.is_floating_point() else v for k, v in state.items()}


def send_update(device: Device, number: int, trained_from: dict[str, torch.Tensor]) -> None:
    header = UpdateHeader(fleet="test", sender=device.name, round=number, n_samples=50, campaign=device.campaign,
                          global_sha256=body_digest(trained_from))
    device.send("update", encode(header, shifted(trained_from, SHIFT[device.name])))


@pytest.mark.parametrize("policy", ["buffered", "synchronous"])
def test_a_stragglers_late_update_is_folded_in_with_its_staleness_weight_not_dropped(
    tmp_path: Path, mosquitto, policy: str
) -> None:
    participation = {"policy": policy, **({"buffer": {"size": 3}} if policy == "buffered" else {})}
    config = coordinator_config(tmp_path, mosquitto.port, 2, start_clients=4, round_timeout_s=20.0, linger_s=0.0,
                                participation=participation)
    signature = fleet_template(load_config(config, CoordinatorConfig), SEED).signature
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    devices = {name: Device(mosquitto.port, name) for name in GATEWAYS}
    for name, device in devices.items():
        device.register(HelloHeader(fleet="test", sender=name, n_features=1, n_samples=50, model_signature=signature))
    first = {name: device.round(1) for name, device in devices.items()}
    for name in ("a", "b", "c"):
        send_update(devices[name], 1, first[name])
    second = {name: device.round(2) for name, device in devices.items()}
    send_update(devices["d"], 1, first["d"])
    reply = devices["d"].reply()
    assert reply.accepted and reply.code == ("late" if policy == "buffered" else "late_no_twin"), reply
    for name in ("a", "b"):
        send_update(devices[name], 2, second[name])
    exits([coordinator])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()

    store = Store(tmp_path / "coordinator")
    try:
        rows = [store.round(1).metrics, store.round(2).metrics]
        result = store.load_file(store.round(2).result_file)
    finally:
        store.close()
    g1 = second["a"]
    if policy == "buffered":
        assert [r["closed_by"] for r in rows] == ["buffer full", "buffer full"]
        assert rows[1]["stale"] == ["d"] and rows[1]["clients"] == ["a", "b"] and rows[1]["dropped"] == ["c"]
        change = (SHIFT["a"] + SHIFT["b"] + SHIFT["d"] / math.sqrt(2)) / 3
    else:
        assert [r["closed_by"] for r in rows] == ["quorum + grace", "deadline"]
        assert rows[1]["stale"] == [] and sorted(rows[1]["dropped"]) == ["c", "d"]
        change = (SHIFT["a"] + SHIFT["b"]) / 2
    for name, tensor in g1.items():
        if tensor.is_floating_point():
            torch.testing.assert_close(result[name], tensor + change, rtol=0, atol=1e-6, msg=name)


def test_a_buffered_fleet_of_real_agents_equals_the_simulation_of_what_happened(tmp_path: Path, mosquitto) -> None:
    """Three real agents, K = 2: each round closes on the first two updates (held late ones
    count; on all three where they come in one batch, as on a loaded machine), so whichever
    agent is slowest sends late and its change is folded into a later round, scaled by its
    staleness (whether one is late depends on timing; the test above pins the stale fold exactly). Whatever the timing, every round's global state equals the
    in-process simulation of the arrivals the store recorded, under the same buffered policy."""
    rounds, settings = 4, ParticipationSettings(policy="buffered", buffer=BufferSettings(size=2))
    coordinator, agents, db = start_fleet(tmp_path, mosquitto.port, 3, rounds, min_clients=2, round_timeout_s=30.0,
                                          participation=settings.model_dump(mode="json"))
    finish([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    store = Store(db)
    try:
        closes = [row.metrics for row in store.rounds() if row.closed_at is not None]
    finally:
        store.close()
    reasons = [m["closed_by"] for m in closes]
    assert len(closes) == rounds and set(reasons) <= {"buffer full", "all participants reported"}, reasons
    simulated = replay(db, write_client_csvs(tmp_path, 3), rounds, participation=settings)
    assert_rounds_equal(served_rounds(db), simulated.states)
