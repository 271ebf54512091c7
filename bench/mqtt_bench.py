"""MQTT pieces the transport and fleet-load benchmarks share: a loopback mosquitto, a connected
paho client, raw publisher -> subscriber throughput, and reading or re-stamping an envelope's JSON
header with json + struct alone (load generators must not import torch, which
``edge_agent.protocol`` does; ``bench/fleet_load.py`` checks the result with ``decode``)."""

from __future__ import annotations

import json
import os
import resource
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import paho.mqtt.client as mqtt

import common  # noqa: F401  the repository on sys.path, for edge_agent
from edge_agent.mqtt import paho_client

PREFIX = struct.Struct(">4sBI")  # edge_agent.protocol.PREFIX: magic, schema version, header length


def envelope_header(payload: bytes) -> dict:
    """The JSON header of an envelope."""
    _, _, length = PREFIX.unpack_from(payload)
    return json.loads(payload[PREFIX.size : PREFIX.size + length])


def restamp(payload: bytes, **fields: object) -> bytes:
    """The envelope with ``fields`` replaced in its header and the same body (digest and size
    stay valid): one sender's message built from a template without touching the tensors."""
    magic, version, length = PREFIX.unpack_from(payload)
    header = {**json.loads(payload[PREFIX.size : PREFIX.size + length]), **fields}
    raw = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(magic, version, len(raw)) + raw + payload[PREFIX.size + length :]


def raise_fd_limit() -> int:
    """Raise this process's open-file soft limit to its hard limit (children inherit it): every
    MQTT connection is a socket. Returns the new limit."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@contextmanager
def loopback_broker(work: Path, max_queued: int, max_inflight: int | None = None) -> Iterator[tuple[int, int]]:
    """A mosquitto on a free loopback port, anonymous, queues of ``max_queued`` messages per
    client; yields its port and pid, terminated on exit."""
    from coordinator.broker_setup import free_port, start_mosquitto, wait_for_port

    port = free_port()
    config = work / "mosquitto.conf"
    inflight = f"max_inflight_messages {max_inflight}\n" if max_inflight else ""
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nmax_queued_messages {max_queued}\n{inflight}")
    broker = start_mosquitto(config, work / "broker")
    try:
        wait_for_port(port, broker)
        yield port, broker.pid
    finally:
        broker.terminate()
        broker.wait(10)


def connected_client(name: str, port: int) -> mqtt.Client:
    """A connected MQTT 5 client with its network loop on a background thread."""
    client = paho_client(name)
    client.max_inflight_messages_set(100)
    client.connect("127.0.0.1", port)
    client.loop_start()
    return client


def raw_throughput(port: int, count: int, size: int) -> float:
    """MB/s from the first publish to the last message received (QoS 1 both ways)."""
    received = threading.Event()
    seen = [0]

    def on_message(_c, _u, _m) -> None:
        seen[0] += 1
        if seen[0] == count:
            received.set()

    subscriber = connected_client(f"raw-sub-{os.getpid()}", port)
    subscriber.on_message = on_message
    subscriber.subscribe("bench/raw", qos=1)
    publisher = connected_client(f"raw-pub-{os.getpid()}", port)
    time.sleep(0.5)
    payload = os.urandom(size)
    started = time.perf_counter()
    for _ in range(count):
        publisher.publish("bench/raw", payload, qos=1)
    if not received.wait(300):
        raise TimeoutError(f"only {seen[0]} of {count} raw messages arrived")
    seconds = time.perf_counter() - started
    for client in (subscriber, publisher):
        client.disconnect()
        client.loop_stop()
    return count * size / seconds / 1e6
