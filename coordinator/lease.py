"""The leader lease of coordinators sharing one PostgreSQL store: the first to take the fleet's
session advisory lock leads; any other stands by, polling, until the leader's session ends
(``kill -9``, crash, lost network: PostgreSQL then releases the lock), and then resumes the
open round from the store as a restarted coordinator would.

Guarantee (fencing): the lock is held by the very session that carries every write of the
leader's store, and PostgreSQL releases it only when that session ends, so nothing an old
leader commits can land after a standby has taken over. A leader whose session ended stops at
its next database access (``LeaseLost``) without acknowledging anything it had not committed.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from coordinator.config import CoordinatorConfig
from coordinator.store import Store
from edge_agent.storage import StateDirError

log = logging.getLogger("edgefl.coordinator")
POLL_S = 0.5
HOLDER = """SELECT a.application_name, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database
WHERE datname = current_database()) AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1"""


def lease_key(fleet: str) -> int:
    """The fleet's advisory lock key: 64 bits of a hash of its name, signed as PostgreSQL wants."""
    return int.from_bytes(hashlib.sha256(f"edgefl-coordinator/{fleet}".encode()).digest()[:8], "big", signed=True)


def take_lead(cfg: CoordinatorConfig, stop: Callable[[], bool] = lambda: False,
              on_event: Callable[[str, dict], None] = lambda kind, data: None) -> Store | None:
    """The store of the coordinator that leads ``cfg.fleet``: at once on SQLite (one process per
    state_dir), on PostgreSQL once this process holds the lease; None if stopped while standing by."""
    if cfg.store.url is None:
        return Store(cfg.state_dir, keep_rounds=cfg.store.keep_rounds, keep_records=cfg.store.keep_records)
    import psycopg

    from coordinator.store_postgres import connect, one_line, where

    connection = connect(cfg.store.url)
    try:
        if not stand_by(connection, cfg.fleet, stop, on_event):
            connection.close()
            return None
    except psycopg.OperationalError as err:
        raise StateDirError(f"store.url: lost PostgreSQL at {where(cfg.store.url)} while standing by: "
                            f"{one_line(err)}") from None
    log.info("leading fleet %s (lease on %s)", cfg.fleet, where(cfg.store.url))
    on_event("leading", {"fleet": cfg.fleet, "store": where(cfg.store.url)})
    return Store(cfg.state_dir, cfg.store.url, connection, cfg.store.keep_rounds, cfg.store.keep_records)


def stand_by(connection, fleet: str, stop: Callable[[], bool], on_event: Callable[[str, dict], None]) -> bool:
    """Poll for the fleet's lease on ``connection``, saying whom we wait for: whether we got it
    (False: stopped first)."""
    key, shown = lease_key(fleet), None
    while not connection.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()[0]:
        leader = holder(connection, key) or "a coordinator that is letting go"
        if leader != shown:
            log.info("standing by: fleet %s is led by %s", fleet, leader)
            on_event("standby", {"fleet": fleet, "leader": leader})
            shown = leader
        if stop():
            return False
        time.sleep(POLL_S)
    return True


def leader_of(store: Store, fleet: str) -> str | None:
    """Who leads ``fleet`` on the PostgreSQL ``store`` right now (None: nobody)."""
    return holder(store.db.connection, lease_key(fleet))


def holder(connection, key: int) -> str | None:
    """Who holds the lease: the leader's connection name (host and pid) and address."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    row = connection.execute(HOLDER, (unsigned >> 32, unsigned & 0xFFFF_FFFF)).fetchone()
    if row is None:
        return None
    name, address = row
    return f"{name or 'an unnamed session'} ({address or 'local socket'})"
