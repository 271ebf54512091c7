"""A full disk recovers by itself: the coordinator's SQLite store on a real 2 MB tmpfs is filled up;
the batch of updates that cannot be stored is held unacknowledged, the close that cannot be stored
leaves nothing behind, both are tried again on the retry timer, and once space is freed the round
closes with every update, without an operator."""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.offline import fed, hello_of, offline_coordinator, transport_of, turn_until, update_of


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


def test_a_full_disk_holds_the_batch_and_the_close_and_the_round_closes_once_space_returns(
    small_disk: Path, tmp_path: Path
) -> None:
    coordinator = offline_coordinator(tmp_path, rounds=2, state_dir=str(small_disk), twin="stale")
    transport, store = transport_of(coordinator), coordinator.store
    fed(coordinator, hello_of(coordinator, "a"), hello_of(coordinator, "b"))
    store.db.reclaim()  # an empty write-ahead log: the next write needs new space
    filler = fill(small_disk)
    fed(coordinator, update_of(coordinator, "a"), update_of(coordinator, "b"))
    assert transport.inbox.empty() and len(transport.acked) == 2, "both updates taken, neither acknowledged: held"
    assert coordinator.storage_retry.failures == 1 and store.updates(1) == []
    filler.unlink()
    turn_until(lambda: len(transport.acked) == 4, coordinator.turn, "the held batch stored")
    assert [u.client_id for u in store.updates(1)] == ["a", "b"]

    store.db.reclaim()
    filler = fill(small_disk)
    assert coordinator.close_if_due(store.round(1)).round == 1 and coordinator.storage_retry.failures == 1
    assert store.round(1).closed_at is None and store.tensors.names("twins/a") == []
    assert coordinator.engine.on_time == {} and coordinator.participants.standing == {}
    filler.unlink()
    turn_until(lambda: store.latest_round().round == 2,
               lambda: coordinator.close_if_due(store.round(1), fresh=coordinator.turn()), "round 1 closed")
    assert store.round(1).metrics["clients"] == ["a", "b"] and coordinator.storage_retry.failures == 0
    assert store.tensors.names("twins/a") == ["twins/a/round_00001.safetensors"]
    store.close()
