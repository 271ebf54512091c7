"""The PostgreSQL backend of the coordinator's ``Store`` (psycopg 3): the same tables as SQLite
plus ``tensors`` (name, safetensors bytes), so every tensor is written in the same transaction
as its row and a standby coordinator on another host reads everything the leader committed."""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlsplit

import psycopg
from psycopg import pq

from coordinator.store_backends import LeaseLost
from edge_agent.storage import StateDirError

# SQLite's types in the shared schema, and what PostgreSQL calls them (applied in this order).
POSTGRES_TYPES = (("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
                  ("INTEGER", "BIGINT"), ("REAL", "DOUBLE PRECISION"), ("BLOB", "BYTEA"))
CONNECT_TIMEOUT_S = 10
SCHEMA_LOCK = 0x656467_666C_5F73  # the advisory lock a migrating session holds ("edgfl_s")
# Server and client TCP keepalives: a leader cut off from the database loses its session (and
# with it the lease) within about 25 s instead of the kernel's two hours.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "options": "-c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5 -c tcp_keepalives_count=3"}


def where(url: str) -> str:
    """``host:port/database`` of a URL, for messages (never the password)."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path or '/'}"


def connect(url: str) -> psycopg.Connection:
    """An autocommit connection named after this process (a standby shows whom it waits for).
    Raises ``StateDirError`` naming ``store.url`` when the server cannot be reached."""
    name = f"edgefl-coordinator {socket.gethostname()} pid {os.getpid()}"
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S, application_name=name,
                               **KEEPALIVES)
    except psycopg.Error as err:
        raise StateDirError(f"store.url: cannot reach PostgreSQL at {where(url)}: {one_line(err)}") from None


def one_line(err: Exception) -> str:
    """libpq's message (several lines, never the password) on one line."""
    return " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__


class PostgresDatabase:
    """One autocommit connection between the explicit transactions the store opens. On the
    leader's connection (the one holding the lease) a dropped session raises ``LeaseLost``."""

    def __init__(self, url: str, connection: psycopg.Connection | None = None):
        self.leading = connection is not None
        self.connection = connection or connect(url)
        self.url, self.where = url, f"the database at {where(url)}"

    def execute(self, sql: str, params: tuple = (), binary: bool = False) -> psycopg.Cursor:
        try:
            return self.connection.execute(sql.replace("?", "%s"), params, binary=binary)
        except psycopg.OperationalError:
            if self.leading and self.connection.broken:
                raise LeaseLost(f"the database session at {where(self.url)} ended: the leader lease is lost") from None
            raise

    def begin(self, exclusive: bool = False) -> None:
        """A transaction; ``exclusive``: one migrating session at a time (a transaction advisory lock)."""
        self.execute("BEGIN")
        if exclusive:
            self.execute("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK,))

    def ddl(self, statement: str) -> str:
        """A statement of the shared schema (SQLite's types) in PostgreSQL's types."""
        for sqlite_type, postgres_type in POSTGRES_TYPES:
            statement = re.sub(rf"\b{sqlite_type}\b", postgres_type, statement)
        return statement

    def tables(self) -> set[str]:
        query = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        return {name for (name,) in self.execute(query)}

    def reclaim(self) -> None:
        """After deleting bodies: mark their space (and their TOAST chunks') reusable now rather
        than at autovacuum's next visit, so the next rounds' bodies fill it."""
        self.execute("VACUUM tensors")

    @property
    def in_transaction(self) -> bool:
        return self.connection.info.transaction_status != pq.TransactionStatus.IDLE

    def size_bytes(self) -> int:
        return int(self.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    def close(self) -> None:
        self.connection.close()
