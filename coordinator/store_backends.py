"""Where the coordinator's ``Store`` keeps its rows and tensors: SQLite (WAL) in the state folder
or PostgreSQL (``coordinator.store_postgres``), tensors in the same database either way. Both
backends take the same SQL (``?`` placeholders, ``ON CONFLICT``) and explicit ``BEGIN``/
``COMMIT``/``SAVEPOINT`` statements."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from coordinator.config import SQLITE_FILE
from edge_agent.storage import StateDirError
from edge_agent.tensors import TensorDict, tensors_from_bytes, tensors_to_bytes

try:
    from psycopg import OperationalError as PostgresOperationalError

    POSTGRES_ERRORS: tuple[type[Exception], ...] = (PostgresOperationalError,)
except ImportError:  # PostgreSQL support is the optional ``postgres`` extra
    POSTGRES_ERRORS = ()

WAL_LIMIT_BYTES = 64 << 20  # the write-ahead log is cut back to this after a checkpoint
# Errors worth retrying or refusing one message for: the disk, and a busy or failing database.
STORAGE_ERRORS = (OSError, sqlite3.OperationalError, *POSTGRES_ERRORS)


class LeaseLost(BaseException):
    """The leader's database session ended, and with it the leader lease: stop at once, commit
    nothing more (a ``BaseException`` so that no per-message guard takes it for a bad message)."""




class SqliteDatabase:
    """``coordinator.sqlite3`` in the state folder: WAL, full sync, autocommit between the
    explicit transactions the store opens."""

    def __init__(self, folder: Path):
        path = folder / SQLITE_FILE
        self.path, self.where = path, f"the database {path}"
        try:
            self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
            self.connection.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        except sqlite3.Error as err:
            raise StateDirError(f"state_dir {folder}: cannot open the database {path.name}: {err}") from None

    def execute(self, sql: str, params: tuple = (), binary: bool = False) -> sqlite3.Cursor:
        """``binary`` (PostgreSQL's binary results) changes nothing here: SQLite returns bytes."""
        return self.connection.execute(sql, params)

    def begin(self, exclusive: bool = False) -> None:
        """A transaction; ``exclusive``: holding the write lock from the start (a migration)."""
        self.connection.execute("BEGIN IMMEDIATE" if exclusive else "BEGIN")

    def ddl(self, statement: str) -> str:
        """The shared schema is written in SQLite's dialect."""
        return statement

    def tables(self) -> set[str]:
        return {name for (name,) in self.connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def reclaim(self) -> None:
        """After deleting bodies: fold the write-ahead log into the database and cut it back (the
        freed pages are on SQLite's free list, which the next rounds' bodies reuse)."""
        self.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def size_bytes(self) -> int:
        """The database's size on disk (main file and write-ahead log)."""
        return sum(path.stat().st_size for path in self.path.parent.glob(self.path.name + "*") if path.is_file())

    def close(self) -> None:
        self.connection.close()


class TensorTable:
    """Tensors as rows of ``tensors`` (safetensors bytes) in the store's own database: written
    inside the open transaction, so they commit with the rows naming them (one sync per batch,
    not one per update file) and a rollback takes them back; nothing to sync or remove."""

    def __init__(self, database):
        self.database = database

    def write(self, name: str, tensors: TensorDict) -> None:
        self.write_body(name, tensors_to_bytes(tensors))

    def write_body(self, name: str, body: bytes) -> None:
        """A verified safetensors body as received (no re-encoding)."""
        self.database.execute(
            "INSERT INTO tensors VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET body=excluded.body", (name, body))

    def read(self, name: str) -> TensorDict:
        row = self.database.execute("SELECT body FROM tensors WHERE name=?", (name,), binary=True).fetchone()
        if row is None:
            raise FileNotFoundError(f"no tensors named {name!r} in {self.database.where}")
        return tensors_from_bytes(bytes(row[0]))

    def exists(self, name: str) -> bool:
        return self.database.execute("SELECT 1 FROM tensors WHERE name=?", (name,)).fetchone() is not None

    def delete(self, name: str) -> None:
        self.database.execute("DELETE FROM tensors WHERE name=?", (name,))

    def names(self, folder: str) -> list[str]:
        """The names directly below ``folder``, sorted."""
        prefix = folder.rstrip("/") + "/"
        rows = self.database.execute(
            "SELECT name FROM tensors WHERE substr(name, 1, ?) = ? ORDER BY name", (len(prefix), prefix))
        return [name for (name,) in rows if "/" not in name[len(prefix):]]

    def bytes_below(self, folder: str) -> int:
        """The total size of the bodies below ``folder`` (e.g. one round's updates)."""
        prefix = folder.rstrip("/") + "/"
        row = self.database.execute(
            "SELECT SUM(length(body)) FROM tensors WHERE substr(name, 1, ?) = ?", (len(prefix), prefix)).fetchone()
        return int(row[0] or 0)


