"""The store's schema as numbered migrations, applied in order on SQLite and PostgreSQL alike.

``schema_version`` records each applied version; opening an older store applies the missing
migrations inside one transaction (all or nothing), a newer one is refused. A store without that
table but with ``rounds`` is version 1: the schema edgefl used before versioning (migration 1)."""

from __future__ import annotations

import time

from edge_agent.storage import StateDirError

SCHEMA_V1 = (
    """CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY, n_features INTEGER, n_samples INTEGER, latitude REAL, longitude REAL,
    signature TEXT, online INTEGER NOT NULL DEFAULT 1, registered_at REAL, last_seen REAL)""",
    """CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, opened_at REAL NOT NULL, deadline REAL NOT NULL, closed_at REAL,
    global_file TEXT NOT NULL, metrics TEXT, result_file TEXT)""",
    """CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL, client_id TEXT NOT NULL, n_samples INTEGER NOT NULL, file TEXT NOT NULL,
    sha256 TEXT NOT NULL, metrics TEXT NOT NULL, received_at REAL NOT NULL, late INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (round, client_id))""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, client_id TEXT, round INTEGER,
    kind TEXT NOT NULL, accepted INTEGER NOT NULL, code TEXT, reason TEXT)""",
    "CREATE TABLE IF NOT EXISTS tensors (name TEXT PRIMARY KEY, body BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS events_by_round ON events (round, accepted)",
)
# Version 2: retention. An update row outlives its body; ``body_deleted_at`` says since when, and
# the partial index finds the bodies still kept without reading the rows whose body is gone.
RETENTION_V2 = (
    "ALTER TABLE updates ADD COLUMN body_deleted_at REAL",
    "CREATE INDEX IF NOT EXISTS updates_with_body ON updates (round) WHERE body_deleted_at IS NULL",
)
MIGRATIONS: tuple[tuple[str, ...], ...] = (SCHEMA_V1, RETENTION_V2)  # migration k makes version k
LATEST = len(MIGRATIONS)
VERSION_TABLE = "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"


def stored_version(database) -> int:
    """0 for an empty database, 1 for a store from before versioning, else the newest recorded."""
    tables = database.tables()
    if "schema_version" in tables:
        return int(database.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] or 0)
    return 1 if "rounds" in tables else 0


def migrate(database) -> list[int]:
    """Bring ``database`` to ``LATEST`` in one exclusive transaction: the versions applied (none
    when current). Raises ``StateDirError`` naming the database and both versions when it is newer,
    or the version whose migration failed (then nothing changed). A current store is only read
    (readers such as the dashboard take no write lock)."""
    if stored_version(database) == LATEST:
        return []
    database.begin(exclusive=True)
    try:
        found = stored_version(database)
        if found > LATEST:
            raise StateDirError(f"{database.where} has store schema version {found}, newer than the {LATEST} this "
                                "edgefl knows: run the edgefl that wrote it, or upgrade edgefl")
        applied = list(range(found + 1, LATEST + 1))
        database.execute(database.ddl(VERSION_TABLE))
        for version in applied:
            apply(database, version)
        database.execute("COMMIT")
    except BaseException:
        if database.in_transaction:
            database.execute("ROLLBACK")
        raise
    return applied


def apply(database, version: int) -> None:
    """Migration ``version``'s statements and its row in ``schema_version``."""
    try:
        for statement in MIGRATIONS[version - 1]:
            database.execute(database.ddl(statement))
        database.execute("INSERT INTO schema_version VALUES (?, ?)", (version, time.time()))
    except Exception as err:  # any database's error: the whole upgrade rolls back
        message = " ".join(str(err).split()) or type(err).__name__
        raise StateDirError(f"{database.where}: migrating the store schema to version {version} failed, "
                            f"nothing was changed: {message}") from None
