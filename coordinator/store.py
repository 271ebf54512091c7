"""Durable coordinator state: SQLite (WAL) for clients, rounds, updates and the accept/reject log,
safetensors files for tensors, each written atomically so a crash never leaves half a file."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file

from edge_agent.protocol import HelloHeader, TensorDict
from edge_agent.storage import (
    StateDirError,
    fsync_folder,
    writable_folder,
    write_bytes_atomically,
    write_tensors_atomically,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS clients (
    client_id TEXT PRIMARY KEY, n_features INTEGER, n_samples INTEGER, latitude REAL, longitude REAL,
    signature TEXT, online INTEGER NOT NULL DEFAULT 1, registered_at REAL, last_seen REAL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, opened_at REAL NOT NULL, deadline REAL NOT NULL, closed_at REAL,
    global_file TEXT NOT NULL, metrics TEXT, result_file TEXT);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL, client_id TEXT NOT NULL, n_samples INTEGER NOT NULL, file TEXT NOT NULL,
    sha256 TEXT NOT NULL, metrics TEXT NOT NULL, received_at REAL NOT NULL, late INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (round, client_id));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, client_id TEXT, round INTEGER,
    kind TEXT NOT NULL, accepted INTEGER NOT NULL, code TEXT, reason TEXT);
"""


@dataclass(frozen=True)
class RoundRow:
    round: int
    opened_at: float
    deadline: float
    closed_at: float | None
    global_file: str
    metrics: dict
    result_file: str | None


@dataclass(frozen=True)
class UpdateRow:
    round: int
    client_id: str
    n_samples: int
    file: str
    sha256: str
    metrics: dict


@dataclass(frozen=True)
class ClientRow:
    client_id: str
    n_features: int
    n_samples: int
    latitude: float | None
    longitude: float | None
    signature: str
    online: bool
    last_seen: float | None


class Store:
    """All coordinator state below one directory; safe to reopen after ``kill -9``.

    Raises ``StateDirError`` naming the path when the folder or its database cannot be opened
    for writing."""

    def __init__(self, state_dir: Path):
        self.dir = writable_folder(state_dir, "state_dir")
        path = self.dir / "coordinator.sqlite3"
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA)
        except sqlite3.Error as err:
            raise StateDirError(f"state_dir {self.dir}: cannot open the database {path.name}: {err}") from None
        self._unsynced: set[Path] = set()
        self._written: list[Path] = []  # update files of the open batch, removed if it rolls back

    @contextmanager
    def batch(self):
        """One transaction for many writes: update files are fsynced as written, their folders
        once at the end, then the rows commit together (group commit). On failure the rows roll
        back and the batch's update files are removed (no file without its row)."""
        self.db.execute("BEGIN")
        try:
            yield
            for folder in self._unsynced:
                fsync_folder(folder)
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            self._discard(self._written)
            raise
        finally:
            self._unsynced.clear()
            self._written.clear()

    @contextmanager
    def savepoint(self):
        """One message's writes inside a ``batch``: if it fails, its rows roll back and its
        files are removed while the rest of the batch stands."""
        mark = len(self._written)
        self.db.execute("SAVEPOINT message")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO message")
            self.db.execute("RELEASE message")
            self._discard(self._written[mark:])
            del self._written[mark:]
            raise
        self.db.execute("RELEASE message")

    @staticmethod
    def _discard(paths: list[Path]) -> None:
        for path in paths:
            with suppress(OSError):
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self.db.close()

    # clients ---------------------------------------------------------------------------------

    def register(self, hello: HelloHeader) -> None:
        now = time.time()
        self.db.execute(
            "INSERT INTO clients VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT(client_id) DO UPDATE SET "
            "n_features=excluded.n_features, n_samples=excluded.n_samples, latitude=excluded.latitude, "
            "longitude=excluded.longitude, signature=excluded.signature, online=1, last_seen=excluded.last_seen",
            (hello.sender, hello.n_features, hello.n_samples, hello.latitude, hello.longitude,
             hello.model_signature, now, now),
        )

    def set_online(self, client_id: str, online: bool) -> None:
        self.db.execute("UPDATE clients SET online=? WHERE client_id=?", (int(online), client_id))

    def seen(self, client_id: str) -> None:
        """A message from ``client_id`` arrived just now (a registered client's last sign of life)."""
        self.db.execute("UPDATE clients SET last_seen=? WHERE client_id=?", (time.time(), client_id))

    def is_registered(self, client_id: str) -> bool:
        """One primary-key lookup (per message; ``clients`` reads the whole table)."""
        return self.db.execute("SELECT 1 FROM clients WHERE client_id=?", (client_id,)).fetchone() is not None

    def client_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM clients").fetchone()[0]

    def online_clients(self) -> set[str]:
        return {row[0] for row in self.db.execute("SELECT client_id FROM clients WHERE online=1")}

    def quorum_state(self, number: int) -> tuple[int, int]:
        """For round ``number``: how many on-time updates it has, and how many online clients have
        not sent one (a close check per message must not read every update row)."""
        updates = self.db.execute("SELECT COUNT(*) FROM updates WHERE round=? AND late=0", (number,)).fetchone()[0]
        waiting = self.db.execute(
            "SELECT COUNT(*) FROM clients WHERE online=1 AND client_id NOT IN "
            "(SELECT client_id FROM updates WHERE round=? AND late=0)", (number,)).fetchone()[0]
        return updates, waiting

    def clients(self) -> dict[str, ClientRow]:
        rows = self.db.execute(
            "SELECT client_id, n_features, n_samples, latitude, longitude, signature, online, last_seen FROM clients"
        )
        return {r[0]: ClientRow(*r[:6], bool(r[6]), r[7]) for r in rows}

    # campaign --------------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, value))

    def campaign(self) -> str:
        """The id of the federation run this state belongs to, made on first use (a fresh state
        starts a new campaign): UTC time of creation plus random digits."""
        fresh = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('campaign', ?)", (fresh,))
        return self.meta("campaign")

    # rounds ----------------------------------------------------------------------------------

    def open_first_round(self, deadline: float, global_state: TensorDict) -> RoundRow:
        """Persist the initial global parameters (file first, then the row)."""
        name = "global/round_00001.safetensors"
        self.save_tensors(name, global_state)
        return self.open_round(1, deadline, name)

    def open_round(self, number: int, deadline: float, global_file: str) -> RoundRow:
        """Open round ``number`` on the global state stored in ``global_file`` (a site aggregator
        opens each round the central coordinator announced)."""
        self.db.execute(
            "INSERT OR IGNORE INTO rounds VALUES (?, ?, ?, NULL, ?, NULL, NULL)",
            (number, time.time(), deadline, global_file),
        )
        return self.round(number)

    def save_tensors(self, name: str, tensors: TensorDict) -> None:
        """A tensor file below the state folder, written atomically."""
        write_tensors_atomically(self.dir / name, tensors)

    def finish_round(
        self, number: int, metrics: dict, result: TensorDict, next_deadline: float | None
    ) -> None:
        """Close ``number`` with its aggregate and, unless it was the last, open the next round
        on that aggregate, in one transaction (the result file is written before it)."""
        name = f"global/round_{number + 1:05d}.safetensors"
        write_tensors_atomically(self.dir / name, result)
        now = time.time()
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "UPDATE rounds SET closed_at=?, metrics=?, result_file=? WHERE round=?",
                (now, json.dumps(metrics), name, number),
            )
            if next_deadline is not None:
                self.db.execute(
                    "INSERT INTO rounds VALUES (?, ?, ?, NULL, ?, NULL, NULL)", (number + 1, now, next_deadline, name)
                )

    def round(self, number: int) -> RoundRow:
        row = self.db.execute("SELECT * FROM rounds WHERE round=?", (number,)).fetchone()
        return RoundRow(*row[:5], json.loads(row[5]) if row[5] else {}, row[6])

    def latest_round(self) -> RoundRow | None:
        row = self.db.execute("SELECT round FROM rounds ORDER BY round DESC LIMIT 1").fetchone()
        return self.round(row[0]) if row else None

    def rounds(self) -> list[RoundRow]:
        return [self.round(r) for (r,) in self.db.execute("SELECT round FROM rounds ORDER BY round")]

    def extend_deadline(self, number: int, deadline: float) -> None:
        self.db.execute("UPDATE rounds SET deadline=? WHERE round=?", (deadline, number))

    def load_file(self, name: str) -> TensorDict:
        return load_file(str(self.dir / name))

    # updates ---------------------------------------------------------------------------------

    def has_update(self, number: int, client_id: str) -> bool:
        query = "SELECT 1 FROM updates WHERE round=? AND client_id=?"
        return self.db.execute(query, (number, client_id)).fetchone() is not None

    def save_update(
        self, number: int, client_id: str, n_samples: int, body: bytes, sha256: str,
        metrics: dict, late: bool = False,
    ) -> None:
        """Keep one client's update: its verified safetensors body as received (no re-encoding),
        then its row; durable once the enclosing ``batch`` commits. The caller checks duplicates."""
        name = f"updates/round_{number:05d}/{client_id}.safetensors"
        self._written.append(self.dir / name)
        write_bytes_atomically(self.dir / name, body, sync_folder=False)
        self._unsynced.add((self.dir / name).parent)
        self.db.execute(
            "INSERT OR IGNORE INTO updates VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (number, client_id, n_samples, name, sha256, json.dumps(metrics), time.time(), int(late)),
        )

    def last_on_time(self) -> dict[str, int]:
        """Each client's newest closed round that aggregated its on-time update (the round's
        recorded ``clients``: an update the engine rejected does not count)."""
        newest: dict[str, int] = {}
        for row in self.rounds():
            for client in row.metrics.get("clients", []) if row.closed_at is not None else []:
                newest[client] = row.round
        return newest

    def last_reported(self) -> dict[str, int]:
        """Each client's newest round with an update (on time or late)."""
        return dict(self.db.execute("SELECT client_id, MAX(round) FROM updates GROUP BY client_id"))

    def latest_metrics(self) -> dict[str, dict]:
        """Each client's metrics from its newest update (on time or late)."""
        query = ("SELECT client_id, metrics FROM updates u WHERE round = "
                 "(SELECT MAX(round) FROM updates WHERE client_id = u.client_id)")
        return {client: json.loads(metrics) for client, metrics in self.db.execute(query)}

    def arrivals(self) -> list[tuple[int, str, bool, float]]:
        """Every stored update as (round, client, late, received at), oldest first."""
        query = "SELECT round, client_id, late, received_at FROM updates ORDER BY received_at"
        return [(r, c, bool(late), at) for r, c, late, at in self.db.execute(query)]

    def updates(self, number: int, include_late: bool = False) -> list[UpdateRow]:
        rows = self.db.execute(
            "SELECT round, client_id, n_samples, file, sha256, metrics FROM updates "
            "WHERE round=? AND (late=0 OR ?) ORDER BY client_id",
            (number, int(include_late)),
        )
        return [UpdateRow(*r[:5], json.loads(r[5])) for r in rows]

    def load_update(self, row: UpdateRow) -> TensorDict:
        return self.load_file(row.file)

    # per-round files of the strategy -------------------------------------------------------

    def save_strategy_state(self, number: int, state: TensorDict) -> None:
        """What the strategy keeps between rounds, as of the close of ``number`` (written before the
        round is marked closed, so a restart finds the state that matches the last close)."""
        if state:
            write_tensors_atomically(self.dir / f"strategy/round_{number:05d}.safetensors", state)

    def strategy_state(self, number: int) -> TensorDict | None:
        path = self.dir / f"strategy/round_{number:05d}.safetensors"
        return load_file(str(path)) if path.is_file() else None

    def save_personal(self, number: int, client_id: str, tensors: TensorDict) -> None:
        write_tensors_atomically(self.dir / f"personal/round_{number:05d}/{client_id}.safetensors", tensors)

    def personal_messages(self, number: int) -> dict[str, TensorDict]:
        """The per-client messages of round ``number`` by client id (none for most strategies)."""
        folder = self.dir / f"personal/round_{number:05d}"
        return {path.stem: load_file(str(path)) for path in sorted(folder.glob("*.safetensors"))}

    # accept / reject log ---------------------------------------------------------------------

    def log(self, kind: str, client_id: str | None, number: int | None, accepted: bool, code: str = "",
            reason: str = "") -> None:
        self.db.execute(
            "INSERT INTO events (at, client_id, round, kind, accepted, code, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (time.time(), client_id, number, kind, int(accepted), code, reason),
        )

    def events(self, accepted: bool | None = None) -> list[dict]:
        rows = self.db.execute("SELECT at, client_id, round, kind, accepted, code, reason FROM events ORDER BY id")
        keys = ("at", "client_id", "round", "kind", "accepted", "code", "reason")
        out = [dict(zip(keys, r)) for r in rows]
        return [e for e in out if accepted is None or bool(e["accepted"]) == accepted]
