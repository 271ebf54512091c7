"""The leader lease on a real PostgreSQL: one leader per fleet, a standby that waits (and can be
stopped while it waits), fencing when the leader's session ends, a clear error for a server that
cannot be reached, and strict ``[store] url`` validation."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from coordinator.broker_setup import free_port
from coordinator.config import CoordinatorConfig, StoreSettings
from coordinator.lease import take_lead
from coordinator.server import Coordinator
from coordinator.store import Store
from coordinator.store_backends import LeaseLost
from edge_agent.storage import StateDirError
from edge_agent.toml_config import load_config
from edge_agent.transport import MemoryTransport
from edgefl.commands import app
from tests.fleet import coordinator_config
from tests.offline import fed, hello_of, resumed, transport_of, update_of


def config(folder: Path, url: str, fleet: str = "test") -> CoordinatorConfig:
    return load_config(coordinator_config(folder, free_port(), 2, fleet=fleet, store={"url": url}), CoordinatorConfig)


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
    status = CliRunner().invoke(app, ["coordinator", "status", "-c", str(tmp_path / "coordinator.toml")])
    assert status.exit_code == 0 and "test is led by edgefl-coordinator " in status.stdout, status.output
    campaign = leader.campaign()
    end_session(leader, postgres_url)
    with pytest.raises(LeaseLost):
        leader.client_count()
    deadline = time.time() + 30  # the terminated session lets go of the lock as it exits
    successor = take_lead(config(tmp_path, postgres_url), stop=lambda: time.time() > deadline)
    assert successor is not None and successor.campaign() == campaign
    for store in (leader, other_fleet, successor):
        store.close()


def end_session(store: Store, url: str) -> None:
    """What a crash or a lost network does to the leader's database session."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (store.db.connection.info.backend_pid,))


def test_a_leader_whose_session_ended_acknowledges_nothing_more_and_a_standby_resumes(
    tmp_path: Path, postgres_url: str
) -> None:
    cfg = config(tmp_path, postgres_url)
    leader = resumed(cfg)  # takes the free lease
    fed(leader, hello_of(leader, "a"))
    end_session(leader.store, postgres_url)
    with pytest.raises(LeaseLost):
        fed(leader, hello_of(leader, "b"), update_of(leader, "a"))
    assert len(transport_of(leader).acked) == 1
    successor = Coordinator(cfg, transport=MemoryTransport())  # stands by until the ended session lets go
    try:
        assert set(successor.store.clients()) == {"a"} and successor.resume().round == 1
        assert successor.store.updates(1) == [] and successor.campaign == leader.campaign
    finally:
        successor.store.close()


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


def test_a_standby_that_loses_the_database_stops_with_a_clear_error(tmp_path: Path, postgres_url: str) -> None:
    leader = take_lead(config(tmp_path, postgres_url))

    def cut_standby_off(kind: str, data: dict) -> None:
        """As the standby announces that it waits, end every session but the leader's."""
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                          "AND pid NOT IN (pg_backend_pid(), %s)", (leader.db.connection.info.backend_pid,))

    with pytest.raises(StateDirError, match=r"store.url: lost PostgreSQL at 127.0.0.1:5432/edgefl_test_\w+ while "
                                            r"standing by: .*terminat"):
        take_lead(config(tmp_path, postgres_url), on_event=cut_standby_off)
    leader.close()
