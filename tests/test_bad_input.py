"""Every kind of bad input reaches the coordinator through a real broker, is rejected with its
reason on the sender's own topic and in the coordinator's log, and the run still finishes."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import torch

from coordinator.config import CoordinatorConfig
from coordinator.server import Coordinator
from coordinator.store import Store
from coordinator.strategies import ClientUpdate, weighted_mean
from edge_agent.agent import Agent
from edge_agent.config import AgentConfig, load_config
from edge_agent.protocol import (
    PREFIX,
    HelloHeader,
    ReplyHeader,
    RoundHeader,
    UpdateHeader,
    body_digest,
    decode,
    encode,
)
from edge_agent.topics import Topics
from tests.fleet import agent_config, coordinator_config, write_client_csvs

LIMIT = 100_000
TOPICS = Topics("test")


class Rogue:
    """A hand-driven MQTT client that speaks for 'client02' and hears the replies to it."""

    def __init__(self, port: int):
        self.replies: queue.Queue[tuple[str, ReplyHeader]] = queue.Queue()
        self.rounds: queue.Queue[tuple[RoundHeader, dict]] = queue.Queue()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="rogue", protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("edgefl/test/agents/+/task", qos=1)
        self.client.subscribe(TOPICS.round, qos=1)
        self.client.loop_start()

    def _on_message(self, _c, _u, message) -> None:
        header, tensors = decode(bytes(message.payload), 1 << 30)
        if isinstance(header, ReplyHeader):
            client = TOPICS.client_of(message.topic)
            if client in ("client02", "intruder"):
                self.replies.put((client, header))
        else:
            self.rounds.put((header, tensors))

    def send(self, leaf: str, payload: bytes, client: str = "client02") -> None:
        self.client.publish(TOPICS.agent(client, leaf), payload, qos=1).wait_for_publish(5)

    def reply(self, timeout: float = 20) -> tuple[str, ReplyHeader]:
        return self.replies.get(timeout=timeout)

    def round(self, number: int) -> dict:
        while True:
            header, tensors = self.rounds.get(timeout=60)
            if header.round == number and not header.finished:
                return tensors


def update(round_number: int, campaign: str, announced: str, **fields) -> UpdateHeader:
    """An update for ``round_number`` bound to its announcement's body digest ``announced``."""
    return UpdateHeader(fleet="test", sender="client02", round=round_number, n_samples=50, campaign=campaign,
                        global_sha256=announced, **fields)


def test_bad_inputs_are_rejected_with_reasons_and_the_run_finishes(tmp_path: Path, mosquitto) -> None:
    paths = write_client_csvs(tmp_path, 2)
    cfg = load_config(
        coordinator_config(
            tmp_path, mosquitto.port, 2, min_clients=3, max_payload_bytes=LIMIT, registration="closed",
            allowed_clients=["client00", "client01", "client02"],
        ),
        CoordinatorConfig,
    )
    coordinator = Coordinator(cfg)
    threads = [threading.Thread(target=coordinator.serve, daemon=True)]
    for i, path in enumerate(paths):
        agent = Agent(load_config(agent_config(tmp_path, mosquitto.port, i, path), AgentConfig))
        threads.append(threading.Thread(target=agent.run, daemon=True))
    rogue = Rogue(mosquitto.port)
    for thread in threads:
        thread.start()

    hello = HelloHeader(fleet="test", sender="client02", n_features=1, n_samples=50,
                        model_signature=coordinator.signature)
    for _ in range(30):  # the coordinator may not have subscribed yet: say hello until answered
        rogue.send("hello", encode(hello))
        try:
            if rogue.reply(timeout=1)[1].accepted:
                break
        except queue.Empty:
            pass
    global_state = rogue.round(1)
    bound = body_digest(global_state)
    good = encode(update(1, coordinator.campaign, bound), global_state)
    header_end = PREFIX.size + PREFIX.unpack_from(good)[2]
    bad = {
        "garbage": (b"\x00\x01garbage", "bad_magic"),
        "truncated": (good[: header_end + 10], "truncated"),
        "version": (good[:4] + bytes([7]) + good[5:], "bad_version"),
        "fleet": (encode(update(1, coordinator.campaign, bound).model_copy(update={"fleet": "other"}), global_state), "wrong_fleet"),
        "sender": (encode(update(1, coordinator.campaign, bound).model_copy(update={"sender": "client01"}), global_state), "wrong_sender"),
        "future": (encode(update(9, coordinator.campaign, bound), global_state), "future_round"),
        "names": (encode(update(1, coordinator.campaign, bound), {**global_state, "shared.extra": torch.zeros(2)}), "bad_tensors"),
        "shape": (encode(update(1, coordinator.campaign, bound), {k: torch.zeros(3) if i == 0 else v for i, (k, v) in
                                     enumerate(global_state.items())}), "bad_tensors"),
        "dtype": (encode(update(1, coordinator.campaign, bound), {k: v.double() for k, v in global_state.items()}), "bad_tensors"),
        "nan": (encode(update(1, coordinator.campaign, bound), {k: torch.full_like(v, float("nan")) for k, v in global_state.items()}),
                "not_finite"),
        "large": (encode(update(1, coordinator.campaign, bound), {**global_state, "pad": torch.zeros(LIMIT // 4)}), "too_large"),
    }
    for payload, _ in bad.values():
        rogue.send("update", payload)
    codes = [rogue.reply()[1].code for _ in bad]
    assert sorted(codes) == sorted(code for _, code in bad.values())
    intruder = HelloHeader(fleet="test", sender="intruder", n_features=1, n_samples=5,
                           model_signature=coordinator.signature)
    rogue.send("hello", encode(intruder), client="intruder")
    client, reply = rogue.reply()
    assert (client, reply.accepted, reply.code) == ("intruder", False, "not_allowed")

    rogue.send("update", good)
    round_two = rogue.round(2)
    second = encode(update(2, coordinator.campaign, body_digest(round_two)), round_two)
    rogue.send("update", second)
    rogue.send("update", second)
    rogue.send("update", good)
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)

    store = Store(cfg.state_dir)
    rejected = store.events(accepted=False)
    logged = {e["code"] for e in rejected}
    assert {code for _, code in bad.values()} | {"not_allowed", "duplicate"} <= logged
    assert all(e["reason"] for e in rejected)
    for number in (1, 2):
        rows = store.updates(number)
        assert [u.client_id for u in rows] == ["client00", "client01", "client02"]
        expected = weighted_mean(
            [ClientUpdate(u.client_id, store.load_update(u), u.n_samples) for u in rows]
        )
        result = store.load_file(store.round(number).result_file)
        assert all(torch.equal(result[k], expected[k]) for k in expected)
    store.close()
