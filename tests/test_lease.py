"""The leader lease on a real PostgreSQL: one leader per fleet, a standby that waits (and can be
stopped while it waits), fencing when the leader's session ends, a clear error for a server that
cannot be reached, and strict ``[store] url`` validation."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError

from coordinator.config import StoreSettings
from coordinator.lease import take_lead
from coordinator.store import Store
from coordinator.store_backends import LeaseLost
from edge_agent.config import dump_toml
from edge_agent.storage import StateDirError
from edge_agent.toml_config import load_config
from tests.fleet import MODEL


def config(folder: Path, url: str, fleet: str = "test"):
    from coordinator.config import CoordinatorConfig

    path = folder / f"{fleet}.toml"
    path.write_text(dump_toml({"fleet": fleet, "state_dir": str(folder / fleet), "model": MODEL,
                               "store": {"url": url}}))
    return load_config(path, CoordinatorConfig)


def test_one_leader_per_fleet_a_standby_stops_cleanly_and_a_dead_session_fences_the_leader(
    tmp_path: Path, postgres_url: str
) -> None:
    leader = take_lead(config(tmp_path, postgres_url))
    other_fleet = take_lead(config(tmp_path, postgres_url, "other"))  # another fleet's lease is its own
    waited: list[dict] = []
    polls = iter(range(3))
    assert take_lead(config(tmp_path, postgres_url), stop=lambda: next(polls) == 2,
                     on_event=lambda kind, data: waited.append({kind: data})) is None
    assert len(waited) == 1 and "edgefl-coordinator" in waited[0]["standby"]["leader"]
    campaign = leader.campaign()
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (leader.db.connection.info.backend_pid,))
    with pytest.raises(LeaseLost):
        leader.client_count()
    deadline = time.time() + 30  # the terminated session lets go of the lock as it exits
    successor = take_lead(config(tmp_path, postgres_url), stop=lambda: time.time() > deadline)
    assert successor is not None and successor.campaign() == campaign
    for store in (leader, other_fleet, successor):
        store.close()


def test_an_unreachable_server_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(StateDirError, match=r"store.url: cannot reach PostgreSQL at 127.0.0.1:1/edgefl"):
        Store(tmp_path, "postgresql://postgres@127.0.0.1:1/edgefl")


@pytest.mark.parametrize("url, why", [
    ("sqlite:///x.db", "only postgresql://"), ("postgresql:///edgefl", "no host"),
    ("postgresql://db.example:5432/", "no database name"), ("postgresql://db.example:99999/edgefl", "Port"),
])
def test_store_urls_are_validated(url: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        StoreSettings(url=url)
