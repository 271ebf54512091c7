"""A hostile gateway cannot stop the fleet (issue 12): a live fleet on a real mosquitto survives
every class of poison message with a reason code for each, internal failures are refusals and
storage failures hold the batch for a retry, neither leaving anything half-written, an agent refuses a poisoned global model and goes on,
and an unwritable state_dir is a one-line error naming the path."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import sqlite3
import subprocess
import sys
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import torch

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator
from coordinator.store import Store
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig, load_config
from edge_agent.learners import fleet_template
from edge_agent.protocol import (
    MAGIC,
    PREFIX,
    HelloHeader,
    ProtocolError,
    ReplyHeader,
    RoundHeader,
    UpdateHeader,
    body_digest,
    claimed_round,
    decode,
    encode,
)
from edge_agent.transport import Incoming, MemoryTransport
from tests.fleet import SEED, agent_config, coordinator_config, exits, start, write_client_csvs
from tests.offline import (
    TOPICS, fed, hello_of, message, offline_coordinator, resumed, transport_of, turn_until, update_of,
)

HOSTILE = "hostile"
UPDATE = {"kind": "update", "fleet": "test", "sender": HOSTILE, "round": 1, "n_samples": 50}


def envelope(header: dict | bytes, body: bytes = b"") -> bytes:
    """An envelope around any header, JSON-encoded unless given as bytes (no validation)."""
    if isinstance(header, dict) and body:
        header = {**header, "body_bytes": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return PREFIX.pack(MAGIC, 1, len(raw)) + raw + body


def poison(global_state: dict[str, torch.Tensor], campaign: str) -> dict[str, tuple[bytes, str]]:
    """Every class of bad update of the issue, with the refusal code each must get (all of the
    running campaign, so that each fails for its own reason)."""
    bound = body_digest(global_state)  # round 1's announcement carries this global state
    good = encode(UpdateHeader(fleet="test", sender=HOSTILE, round=1, n_samples=50, campaign=campaign,
                               global_sha256=bound), global_state)
    update = {**UPDATE, "campaign": campaign}
    nan = {k: torch.full_like(v, float("nan")) for k, v in global_state.items()}
    return {
        "deep nesting": (envelope(b"[" * 30_000 + b"]" * 30_000), "bad_header"),
        "100,000 nested arrays": (envelope(b"[" * 100_000 + b"]" * 100_000), "bad_header"),
        "5000 digits": (envelope(json.dumps(update).replace("50", "9" * 5000).encode()), "bad_header"),
        "n_samples 2**63": (envelope({**update, "n_samples": 2**63}), "bad_header"),
        "round as string": (envelope({**update, "round": "1"}), "bad_header"),
        "round as bool": (envelope({**update, "round": True}), "bad_header"),
        "round as float": (envelope({**update, "round": 1.0}), "bad_header"),
        "n_samples as string": (envelope({**update, "n_samples": "100"}), "bad_header"),
        "40 metrics": (envelope({**update, "metrics": {f"m{i}": 1.0 for i in range(40)}}), "bad_header"),
        "200,000 metrics": (envelope({**update, "metrics": {f"m{i}": 1.0 for i in range(200_000)}}), "bad_header"),
        "lone surrogate key": (envelope({**update, "metrics": {"\ud800": 1.0}}), "bad_header"),
        "NaN constant": (envelope(json.dumps({**update, "metrics": {"loss": float("nan")}}).encode()), "bad_header"),
        "truncated": (good[: len(good) // 2], "truncated"),
        "garbage": (b"\xff\x00garbage\x13" * 7, "bad_magic"),
        "non-finite weights": (encode(UpdateHeader(fleet="test", sender=HOSTILE, round=1, n_samples=50,
                                                    campaign=campaign, global_sha256=bound), nan), "not_finite"),
        "future round": (encode(UpdateHeader(fleet="test", sender=HOSTILE, round=99, n_samples=50,
                                             campaign=campaign, global_sha256=bound), global_state), "future_round"),
    }


class Device:
    """A raw MQTT client publishing on its own agent topics, hearing its replies and the rounds."""

    def __init__(self, port: int, name: str = HOSTILE):
        self.name = name
        self.replies: queue.Queue[ReplyHeader] = queue.Queue()
        self.rounds: queue.Queue[tuple[RoundHeader, dict]] = queue.Queue()
        self.campaign = ""
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{name}-raw", protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe([(TOPICS.agent(name, "task"), 1), (TOPICS.round, 1)])
        self.client.loop_start()

    def _on_message(self, _client, _userdata, message: mqtt.MQTTMessage) -> None:
        header, tensors = decode(bytes(message.payload), 1 << 30)
        if isinstance(header, ReplyHeader):
            self.replies.put(header)
        else:
            self.rounds.put((header, tensors))

    def send(self, leaf: str, payload: bytes) -> None:
        self.client.publish(TOPICS.agent(self.name, leaf), payload, qos=1).wait_for_publish(30)

    def reply(self, timeout: float = 60) -> ReplyHeader:
        """The next answer, past any to a repeated hello of ``register``."""
        while True:
            reply = self.replies.get(timeout=timeout)
            if not (reply.about == "hello" and reply.accepted):
                return reply

    def round(self, number: int, timeout: float = 120) -> dict[str, torch.Tensor]:
        while True:
            header, tensors = self.rounds.get(timeout=timeout)
            if header.round == number:
                self.campaign = header.campaign
                return tensors

    def register(self, hello: HelloHeader) -> None:
        """Say hello until answered (the coordinator may not have subscribed yet)."""
        for _ in range(60):
            self.send("hello", encode(hello))
            try:
                if self.replies.get(timeout=2).accepted:
                    return
            except queue.Empty:
                pass
        raise TimeoutError("the coordinator never accepted the hello")


def test_a_hostile_device_cannot_stop_the_fleet(tmp_path: Path, mosquitto) -> None:
    """The device stays registered and online; it sends every class of poison message during
    round 1, a late update (and its duplicate) during round 2, which must not feed its twin, and
    in round 3 an on-time update scaled x1000 claiming 10**9 samples, which the round's screening
    leaves out. Every round aggregates the two honest clients only and the run finishes."""
    paths = write_client_csvs(tmp_path, 2)
    # each round waits for the device's messages (quorum 1.0); 15 s lets round 3's honest updates arrive on a
    # loaded machine: at 5 s one came late under four test workers, and a screen of two cannot judge the poison
    config = coordinator_config(tmp_path, mosquitto.port, 3, min_clients=2, start_clients=3, round_timeout_s=15.0,
                                participation={"quorum": 1.0})
    template = fleet_template(load_config(config, CoordinatorConfig), SEED)
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(config))
    agents = [start(tmp_path, f"agent{i}", "agent", "run", "-c", str(agent_config(tmp_path, mosquitto.port, i, p)))
              for i, p in enumerate(paths)]
    device = Device(mosquitto.port)
    hello = HelloHeader(fleet="test", sender=HOSTILE, n_features=1, n_samples=50, model_signature=template.signature)
    device.register(hello)
    device.send("hello", envelope({**hello.model_dump(), "n_samples": 2**63}))
    assert device.reply().code == "bad_header"

    device.round(1)
    bad = poison(template.initial, device.campaign)
    for payload, _ in bad.values():
        device.send("update", payload)
    codes = sorted(device.reply().code for _ in bad)
    assert codes == sorted(code for _, code in bad.values())
    assert coordinator.poll() is None, "the coordinator died"

    state = device.round(2)
    late = encode(UpdateHeader(fleet="test", sender=HOSTILE, round=1, n_samples=50, campaign=device.campaign,
                               global_sha256=body_digest(template.initial)), state)
    device.send("update", late)
    assert device.reply().code == "late_no_twin"
    device.send("update", late)
    assert device.reply().code == "duplicate"
    state = device.round(3)
    poisoned = {name: tensor * 1000 for name, tensor in state.items()}
    device.send("update", encode(UpdateHeader(fleet="test", sender=HOSTILE, round=3, n_samples=10**9,
                                              campaign=device.campaign, global_sha256=body_digest(state)), poisoned))
    assert device.reply().accepted, "a well-formed update is stored; the round's screening judges it"
    exits([coordinator, *agents])
    assert coordinator.returncode == 0, (tmp_path / "coordinator.log").read_text()
    assert all(agent.returncode == 0 for agent in agents)

    store = Store(tmp_path / "coordinator")
    try:
        refused = [e["code"] for e in store.events(accepted=False) if e["client_id"] == HOSTILE]
        assert sorted(refused) == sorted(["bad_header", "duplicate", "norm_outlier",
                                          *(code for _, code in bad.values())])
        assert all(e["reason"] for e in store.events(accepted=False))
        kept = [e["code"] for e in store.events(accepted=True) if e["client_id"] == HOSTILE and e["kind"] == "update"]
        assert kept == ["late_no_twin", ""]
        assert [row.metrics["clients"] for row in store.rounds()] == [["client00", "client01"]] * 3
        assert [row.metrics["rejected"] for row in store.rounds()] == [{}, {}, {HOSTILE: "norm_outlier"}]
        assert store.tensors.names(f"twins/{HOSTILE}") == []
    finally:
        store.close()
    assert "Traceback" not in (tmp_path / "coordinator.log").read_text()


def stored_updates(coordinator: Coordinator, number: int = 1) -> list[str]:
    """The update bodies the store holds for round ``number`` (rows of its tensor table)."""
    return [name.rsplit("/", 1)[-1] for name in coordinator.store.tensors.names(f"updates/round_{number:05d}")]


def test_a_storage_error_holds_the_whole_batch_until_the_retry_timer_stores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failing on a full disk is the store's failure, not the message's: the batch is held,
    unacknowledged, with nothing refused or half-written, and stored by the retry timer once the
    disk takes writes again."""
    coordinator = offline_coordinator(tmp_path)
    transport = transport_of(coordinator)
    fed(coordinator, hello_of(coordinator, "a"))
    write_body = coordinator.store.tensors.write_body

    def disk_full(name: str, body: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(coordinator.store.tensors, "write_body", disk_full)
    fed(coordinator, update_of(coordinator, "a"), hello_of(coordinator, "b"))
    assert set(coordinator.store.clients()) == {"a"} and coordinator.store.events(accepted=False) == []
    assert len(transport.acked) == 1 and transport.inbox.empty(), "both taken, neither acknowledged: held"
    assert stored_updates(coordinator) == []
    monkeypatch.setattr(coordinator.store.tensors, "write_body", write_body)
    turn_until(lambda: len(transport.acked) == 3, coordinator.turn, "the held batch stored")
    assert set(coordinator.store.clients()) == {"a", "b"}
    assert [u.client_id for u in coordinator.store.updates(1)] == ["a"]
    assert stored_updates(coordinator) == ["a.safetensors"]
    coordinator.store.close()


def test_a_batch_that_cannot_commit_is_retried_then_left_unacknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up at the batch's commit: tried again, committed once it can be; never
    acknowledged (so redelivered later) while it cannot, and no update body is left behind."""
    coordinator = offline_coordinator(tmp_path)
    acked = transport_of(coordinator).acked
    failures = [2]
    database = coordinator.store.db
    execute = database.execute

    def full_disk_at_commit(sql: str, *args, **kwargs):
        if sql == "COMMIT" and failures[0] > 0:
            failures[0] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return execute(sql, *args, **kwargs)

    monkeypatch.setattr(database, "execute", full_disk_at_commit)
    fed(coordinator, hello_of(coordinator, "a"), hello_of(coordinator, "b"))
    fed(coordinator, update_of(coordinator, "a"))
    assert [u.client_id for u in coordinator.store.updates(1)] == ["a"] and len(acked) == 3
    failures[0] = 3
    fed(coordinator, update_of(coordinator, "b"))
    assert [u.client_id for u in coordinator.store.updates(1)] == ["a"] and len(acked) == 3
    assert stored_updates(coordinator) == ["a.safetensors"]
    coordinator.store.close()


def test_after_a_restart_late_updates_still_feed_only_twins_of_clients_once_on_time(tmp_path: Path) -> None:
    """'a' is on time in round 1, 'b' (offline) never: after a coordinator restart, b's late
    round-1 update is stored but not used, a's twin history stands."""
    coordinator = offline_coordinator(tmp_path)
    fed(coordinator, hello_of(coordinator, "a"), hello_of(coordinator, "b"))
    fed(coordinator, message("b", "status", b"offline"), update_of(coordinator, "a"))
    assert coordinator.close_if_due(coordinator.store.round(1)).round == 2
    coordinator.store.close()
    restarted = resumed(coordinator.cfg)
    assert restarted.engine.on_time == {"a": 1}
    fed(restarted, update_of(restarted, "b"))
    late = [e for e in restarted.store.events(accepted=True) if e["client_id"] == "b" and e["kind"] == "update"]
    assert [e["code"] for e in late] == ["late_no_twin"] and restarted.engine.history.last_round("b") is None
    restarted.store.close()


def test_decoding_any_poison_raises_nothing_but_protocol_errors() -> None:
    for name, (payload, _) in poison({"shared.w": torch.zeros(3)}, "c1").items():
        assert claimed_round(payload) in (0, 1, 99), name
        try:
            decode(payload, 1 << 30)
        except ProtocolError:
            pass


def test_an_unexpected_failure_is_refused_as_internal_and_leaves_no_orphan_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = offline_coordinator(tmp_path)
    fed(coordinator, hello_of(coordinator, "a"), hello_of(coordinator, "b"))
    save = coordinator.store.save_update

    def overflowing(number: int, client_id: str, *args, **kwargs) -> None:
        save(number, client_id, *args, **kwargs)
        if client_id == "a":
            raise OverflowError("Python int too large to convert to SQLite INTEGER")

    monkeypatch.setattr(coordinator.store, "save_update", overflowing)
    fed(coordinator, update_of(coordinator, "a"), update_of(coordinator, "b"))
    refused = coordinator.store.events(accepted=False)
    assert [(e["client_id"], e["code"]) for e in refused] == [("a", "internal")]
    assert "OverflowError" in refused[0]["reason"]
    assert [u.client_id for u in coordinator.store.updates(1)] == ["b"]
    assert stored_updates(coordinator) == ["b.safetensors"]
    coordinator.store.close()


def round_message(number: int, state: dict[str, torch.Tensor], signature: str) -> Incoming:
    header = RoundHeader(fleet="test", sender="coordinator", round=number, deadline_unix=1e10,
                         model_signature=signature, campaign="c1")
    return Incoming(TOPICS.round, encode(header, state), 0, 1, True)


def handled(agent: Agent, message: Incoming) -> None:
    """``message`` handled by ``agent`` as its loop does, and the round it starts trained."""
    agent.receive(message)
    if agent.training is not None:
        assert agent.finish_training(timeout=120)


def test_an_agent_refuses_a_poisoned_global_and_survives_a_diverged_round(tmp_path: Path) -> None:
    """Non-finite, huge (finite 1e30) and misshapen global models are refused and the round is
    trained from the last good one; a diverged round (a learning rate that overflows float32) skips
    the round without an update; a failure while handling a message is logged; a restarted agent
    facing the retained poisoned round refuses it again instead of crash-looping."""
    config = agent_config(tmp_path, free_port(), 0, write_client_csvs(tmp_path, 1)[0])
    events: list[tuple[str, dict]] = []
    agent = Agent(load_config(config, AgentConfig), on_event=lambda kind, data: events.append((kind, data)),
                  transport=MemoryTransport())
    good, ours = fleet_template(agent.cfg, agent.cfg.seed).initial, agent.facts.signature
    poisoned = [
        ({k: torch.full_like(v, float("nan")) for k, v in good.items()}, ours),
        ({k: torch.full_like(v, 1e30) for k, v in good.items()}, ours),
        ({**good, "shared.extra": torch.zeros(2)}, ours),
        (good, "ab" * 16),
    ]
    handled(agent, round_message(1, good, ours))
    for number, (state, signature) in enumerate(poisoned, 2):
        handled(agent, round_message(number, state, signature))
    assert [kind for kind, _ in events] == ["joined", "sent", *["global_refused", "sent"] * len(poisoned)]
    assert all(torch.isfinite(t).all() for t in agent.files.fleet_state().values())

    agent.cfg = agent.cfg.model_copy(update={"training": agent.cfg.training.model_copy(update={"lr": 1e30})})
    handled(agent, round_message(6, good, ours))
    assert events[-1][0] == "failed" and agent.files.trained_round() == 6
    assert "diverged" in events[-1][1]["reason"]
    agent.files.save_global = None  # not callable: handling the round raises
    handled(agent, round_message(7, good, ours))
    assert events[-1][0] == "error"

    restarted = Agent(load_config(config, AgentConfig), on_event=lambda kind, data: events.append((kind, data)),
                      transport=MemoryTransport())
    handled(restarted, round_message(8, *poisoned[0]))
    assert [kind for kind, _ in events[-2:]] == ["global_refused", "sent"]


def test_an_unwritable_state_dir_is_a_one_line_error_naming_the_path(tmp_path: Path) -> None:
    """(As root a read-only folder is still writable: a path below a file stands in for it.)"""
    (tmp_path / "file").write_text("")
    state_dir = tmp_path / "file" / "state"
    coordinator = coordinator_config(tmp_path, free_port(), 1, state_dir=str(state_dir))
    agent = agent_config(tmp_path, free_port(), 0, tmp_path / "missing.csv")
    agent.write_text(agent.read_text().replace(str(tmp_path / "agent0"), str(state_dir)))
    (tmp_path / "db" / "coordinator.sqlite3").mkdir(parents=True)
    no_database = coordinator_config(tmp_path / "db", free_port(), 1, state_dir=str(tmp_path / "db"))
    (tmp_path / "typo").mkdir()
    misspelt = coordinator_config(tmp_path / "typo", free_port(), 1, state_dir=str(tmp_path / "nowhere"))
    cases = {
        ("coordinator", "serve", "-c", str(coordinator)): f"state_dir {state_dir} is not a writable folder",
        ("agent", "run", "-c", str(agent)): f"state_dir {state_dir} is not a writable folder",
        ("coordinator", "status", "-c", str(no_database)): f"state_dir {tmp_path / 'db'}: cannot open the database",
        ("coordinator", "status", "-c", str(misspelt)): f"state_dir {tmp_path / 'nowhere'}: no coordinator state there",
    }
    for args, expected in cases.items():
        run = subprocess.run([sys.executable, "-m", "edgefl.cli", *args], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "COLUMNS": "1000"})
        assert run.returncode == 2 and run.stderr.count("\n") == 1 and expected in run.stderr, run.stderr
    assert not (tmp_path / "nowhere").exists()  # status creates no state where there was none


def test_an_agent_whose_updates_the_broker_would_drop_refuses_to_start(tmp_path: Path) -> None:
    """The broker refuses a publish over max_packet_size (max_payload_bytes + the MQTT headers) and
    paho re-sends it after every reconnect: an agent whose model cannot fit says so at start instead."""
    config = load_config(agent_config(tmp_path, free_port(), 0, write_client_csvs(tmp_path, 1)[0]), AgentConfig)
    Agent(config)
    with pytest.raises(ValueError, match=r"max_payload_bytes: this model's updates take about \d+ bytes"):
        Agent(config.model_copy(update={"max_payload_bytes": 4096}))
