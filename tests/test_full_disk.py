"""A full disk recovers by itself: the coordinator's SQLite store on a real 2 MB tmpfs is filled up;
the batch of updates that cannot be stored is held unacknowledged, the close that cannot be stored
leaves nothing behind, both are tried again on the retry timer, and once space is freed the round
closes with every update, without an operator."""

from __future__ import annotations

import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.server import Coordinator
from edge_agent.mqtt import Incoming
from edge_agent.protocol import UpdateHeader, encode
from tests.test_hostile import hello_of, message, offline_coordinator

DEADLINE_S = 20


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs mounted for this test (root only), unmounted after it."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(folder)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(folder: Path) -> Path:
    """A file that takes every byte left on ``folder``'s file system."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    return filler


def update(coordinator: Coordinator, client: str) -> Incoming:
    header = UpdateHeader(fleet="test", sender=client, round=1, n_samples=50, campaign=coordinator.campaign,
                          global_sha256=coordinator.announced_digest(1))
    return message(client, "update", encode(header, coordinator.initial))


def turn_until(done, turn, what: str) -> None:
    """Service-loop ``turn``s until ``done()``, within ``DEADLINE_S``."""
    deadline = time.monotonic() + DEADLINE_S
    while not done() and time.monotonic() < deadline:
        turn()
    assert done(), f"{what} within {DEADLINE_S} s"


def test_a_full_disk_holds_the_batch_and_the_close_and_the_round_closes_once_space_returns(
    small_disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator = offline_coordinator(tmp_path, rounds=2, state_dir=str(small_disk), twin="stale")
    acked: list[Incoming] = []
    monkeypatch.setattr(coordinator.connection, "ack", acked.append)
    store = coordinator.store
    coordinator._process([hello_of(coordinator, "a"), hello_of(coordinator, "b")])
    store.db.reclaim()  # an empty write-ahead log: the next write needs new space
    filler = fill(small_disk)
    coordinator._process([update(coordinator, "a"), update(coordinator, "b")])
    assert len(coordinator._held) == 2 and coordinator.storage_retry.failures == 1 and len(acked) == 2
    assert store.updates(1) == []
    filler.unlink()
    turn_until(lambda: not coordinator._held, coordinator._step, "the held batch stored")
    assert [u.client_id for u in store.updates(1)] == ["a", "b"] and len(acked) == 4

    store.db.reclaim()
    filler = fill(small_disk)
    assert coordinator._maybe_close(store.round(1)).round == 1 and coordinator.storage_retry.failures == 1
    assert store.round(1).closed_at is None and store.tensors.names("twins/a") == []
    assert coordinator.engine.on_time == {} and coordinator.participants.standing == {}
    filler.unlink()
    turn_until(lambda: store.latest_round().round == 2,
               lambda: coordinator._maybe_close(store.round(1), fresh=coordinator._step()), "round 1 closed")
    assert store.round(1).metrics["clients"] == ["a", "b"] and coordinator.storage_retry.failures == 0
    assert store.tensors.names("twins/a") == ["twins/a/round_00001.safetensors"]
    store.close()
