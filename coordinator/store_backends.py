"""Where the coordinator's ``Store`` keeps its rows and tensors: SQLite (WAL) in the state folder
with tensors as safetensors files beside it, or PostgreSQL with tensors in the database
(``coordinator.store_postgres``). Both backends take the same SQL (``?`` placeholders,
``ON CONFLICT``) and explicit ``BEGIN``/``COMMIT``/``SAVEPOINT`` statements."""

from __future__ import annotations

import sqlite3
from contextlib import suppress
from pathlib import Path, PurePosixPath

from safetensors.torch import load_file

from edge_agent.storage import StateDirError, fsync_folder, write_bytes_atomically, write_tensors_atomically
from edge_agent.tensors import TensorDict

try:
    from psycopg import OperationalError as PostgresOperationalError

    POSTGRES_ERRORS: tuple[type[Exception], ...] = (PostgresOperationalError,)
except ImportError:  # PostgreSQL support is the optional ``postgres`` extra
    POSTGRES_ERRORS = ()

# Errors worth retrying or refusing one message for: the disk, and a busy or failing database.
STORAGE_ERRORS = (OSError, sqlite3.OperationalError, *POSTGRES_ERRORS)


class LeaseLost(BaseException):
    """The leader's database session ended, and with it the leader lease: stop at once, commit
    nothing more (a ``BaseException`` so that no per-message guard takes it for a bad message)."""


class SqliteDatabase:
    """``coordinator.sqlite3`` in the state folder: WAL, full sync, autocommit between the
    explicit transactions the store opens."""

    def __init__(self, folder: Path):
        path = folder / "coordinator.sqlite3"
        try:
            self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.connection.execute("PRAGMA journal_mode=WAL")
            self.connection.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as err:
            raise StateDirError(f"state_dir {folder}: cannot open the database {path.name}: {err}") from None

    def execute(self, sql: str, params: tuple = ()) -> sqlite3.Cursor:
        return self.connection.execute(sql, params)

    def create(self, schema: str) -> None:
        self.connection.executescript(schema)

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def close(self) -> None:
        self.connection.close()


class TensorFiles:
    """Tensors as safetensors files below the state folder, each written atomically. Update
    bodies written inside a batch are fsynced as written and their folders once before the
    commit; the files of a batch or savepoint that rolls back are removed (no file without its row)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._unsynced: set[Path] = set()
        self._written: list[Path] = []

    def write(self, name: str, tensors: TensorDict) -> None:
        write_tensors_atomically(self.folder / name, tensors)

    def write_body(self, name: str, body: bytes) -> None:
        """A verified safetensors body as received, durable once the enclosing batch commits."""
        path = self.folder / name
        self._written.append(path)
        write_bytes_atomically(path, body, sync_folder=False)
        self._unsynced.add(path.parent)

    def read(self, name: str) -> TensorDict:
        return load_file(str(self.folder / name))

    def exists(self, name: str) -> bool:
        return (self.folder / name).is_file()

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)

    def names(self, folder: str) -> list[str]:
        """The names of the tensor files directly in ``folder``, sorted."""
        return [str(PurePosixPath(folder) / path.name) for path in sorted((self.folder / folder).glob("*.safetensors"))]

    def mark(self) -> int:
        return len(self._written)

    def before_commit(self) -> None:
        for folder in self._unsynced:
            fsync_folder(folder)

    def discard(self, mark: int = 0) -> None:
        """Remove the bodies written since ``mark`` (their rows rolled back)."""
        for path in self._written[mark:]:
            with suppress(OSError):
                path.unlink(missing_ok=True)
        del self._written[mark:]

    def settle(self) -> None:
        """The batch is over (committed or discarded): forget what it wrote."""
        self._unsynced.clear()
        self._written.clear()

