"""Durable coordinator state: clients, rounds, updates, tensors and the accept/reject log, in one
database: SQLite (WAL) in the state folder, or PostgreSQL (``coordinator.store_backends``)."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from coordinator.store_backends import STORAGE_ERRORS, SqliteDatabase, TensorTable
from coordinator.store_schema import migrate
from edge_agent.protocol import HelloHeader, TensorDict
from edge_agent.storage import StateDirError, writable_folder

log = logging.getLogger("edgefl.coordinator")
EVENT_KEYS = ("at", "client_id", "round", "kind", "accepted", "code", "reason")  # a row of ``events``


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
    """All coordinator state, safe to reopen after ``kill -9``: SQLite in ``state_dir`` (the
    default), or PostgreSQL at ``url``. Every tensor (global states, updates as received, strategy
    state, personal messages, twins' history) is a row of ``tensors`` (safetensors bytes), written
    in the same transaction as the rows naming it: a batch of updates is durable with one sync, and
    a standby on another host resumes from the database alone. ``connection``: the leader lease's
    session (``coordinator.lease``), which then carries every write. ``keep_rounds``: closing a
    round deletes the per-round bodies of older rounds (``prune``); ``keep_records``: and the
    records of rounds older still (``forget``); None keeps them. ``clock``: the seconds since the
    epoch (a simulation's own clock: ``coordinator.simulation.grid``).

    Raises ``StateDirError`` naming the path (or ``store.url``) when the state cannot be opened,
    or when its schema is newer than this code's (an older one is migrated: ``store_schema``)."""

    def __init__(self, state_dir: Path, url: str | None = None, connection=None, keep_rounds: int | None = None,
                 keep_records: int | None = None, clock: Callable[[], float] = time.time):
        self.dir = writable_folder(state_dir, "state_dir")
        self.clock = clock  # the service's clock: every time it records and every deadline it sets
        self.keep_rounds, self.keep_records = keep_rounds, keep_records
        self._reclaim_due = False  # rounds were pruned in the open transaction: reclaim after its commit
        self._forgotten: int | None = None  # ``forgotten_through``, read once per ``forget``: every update asks
        self.db, self.tensors = open_backend(self.dir, url, connection)
        try:
            migrate(self.db)
        except STORAGE_ERRORS as err:
            self.db.close()
            where = "store.url" if url else f"state_dir {self.dir}"
            raise StateDirError(f"{where}: cannot create or migrate the tables: {err}") from None
        except StateDirError:
            self.db.close()
            raise
        self._check_tensors_present(url)

    def _check_tensors_present(self, url: str | None) -> None:
        """Rounds whose first global state is not in the database: a state folder of an edgefl
        that kept tensors as files (before 0.2). Say so instead of failing at the first read."""
        latest = self.latest_round()
        if latest is not None and not self.tensors.exists(latest.global_file):
            self.db.close()
            where = "store.url" if url else f"state_dir {self.dir}"
            raise StateDirError(f"{where}: its rounds have no tensors in the database (a state written by an "
                                "edgefl that kept them as files?): finish that campaign with that version, "
                                "or start this one in a new state_dir")

    @contextmanager
    def batch(self):
        """One transaction for many writes (group commit: the rows and update bodies of a whole
        batch reach the disk with one sync). On failure all of it rolls back. Inside a batch:
        part of that one."""
        if self.db.in_transaction:
            yield
            return
        self.db.begin()
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self._reclaim_due = False
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        if self._reclaim_due:
            self._reclaim()

    @contextmanager
    def savepoint(self):
        """One message's writes inside a ``batch``: if it fails, its rows and tensors roll back
        while the rest of the batch stands. Outside a batch: a batch of its own."""
        if not self.db.in_transaction:
            with self.batch(), self.savepoint():
                yield
            return
        self.db.execute("SAVEPOINT message")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK TO SAVEPOINT message")
            self.db.execute("RELEASE SAVEPOINT message")
            raise
        self.db.execute("RELEASE SAVEPOINT message")

    def close(self) -> None:
        self.db.close()

    # clients ---------------------------------------------------------------------------------

    def register(self, hello: HelloHeader) -> None:
        now = self.clock()
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
        self.db.execute("UPDATE clients SET last_seen=? WHERE client_id=?", (self.clock(), client_id))

    def is_registered(self, client_id: str) -> bool:
        """One primary-key lookup (per message; ``clients`` reads the whole table)."""
        return self.db.execute("SELECT 1 FROM clients WHERE client_id=?", (client_id,)).fetchone() is not None

    def client_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM clients").fetchone()[0]

    def client_totals(self) -> tuple[int, int, int]:
        """How many clients registered, and their features and samples summed (one query)."""
        count, features, samples = self.db.execute(
            "SELECT COUNT(*), SUM(n_features), SUM(n_samples) FROM clients").fetchone()
        return int(count), int(features or 0), int(samples or 0)

    def online_clients(self) -> set[str]:
        return {row[0] for row in self.db.execute("SELECT client_id FROM clients WHERE online=1")}

    def quorum_state(self, number: int) -> tuple[int, set[str]]:
        """For round ``number``: how many on-time updates it has, and the online clients that have
        not sent one (two indexed queries; a close check must not read every update row)."""
        updates = self.db.execute("SELECT COUNT(*) FROM updates WHERE round=? AND late=0", (number,)).fetchone()[0]
        pending = {row[0] for row in self.db.execute(
            "SELECT client_id FROM clients WHERE online=1 AND client_id NOT IN "
            "(SELECT client_id FROM updates WHERE round=? AND late=0)", (number,))}
        return updates, pending

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
        self.db.execute("INSERT INTO meta VALUES ('campaign', ?) ON CONFLICT DO NOTHING", (fresh,))
        return self.meta("campaign")

    # rounds ----------------------------------------------------------------------------------

    def open_first_round(self, deadline: float, global_state: TensorDict) -> RoundRow:
        """Persist the initial global parameters (a file is written before the row commits)."""
        name = "global/round_00001.safetensors"
        with self.batch():
            self.tensors.write(name, global_state)
            return self.open_round(1, deadline, name)

    def open_round(self, number: int, deadline: float, global_file: str) -> RoundRow:
        """Open round ``number`` on the global state stored as ``global_file`` (a site aggregator
        opens each round the central coordinator announced)."""
        self.db.execute("INSERT INTO rounds VALUES (?, ?, ?, NULL, ?, NULL, NULL) ON CONFLICT DO NOTHING",
                        (number, self.clock(), deadline, global_file))
        return self.round(number)

    def save_tensors(self, name: str, tensors: TensorDict) -> None:
        """Named tensors in the store (committed with the enclosing batch, if any)."""
        self.tensors.write(name, tensors)

    def finish_round(
        self, number: int, metrics: dict, result: TensorDict, next_deadline: float | None
    ) -> None:
        """Close ``number`` with its aggregate and, unless it was the last, open the next round
        on that aggregate, in one transaction (a result file is written before it commits); with
        ``keep_rounds``, the bodies of the rounds that fall out of the window go in it too."""
        name = f"global/round_{number + 1:05d}.safetensors"
        now = self.clock()
        with self.batch():
            if self.keep_rounds is not None and number > self.keep_rounds:
                self.prune(number - self.keep_rounds)
            if self.keep_records is not None and number > self.keep_records:
                self.forget(number - self.keep_records)
            self.tensors.write(name, result)
            self.db.execute(
                "UPDATE rounds SET closed_at=?, metrics=?, result_file=? WHERE round=?",
                (now, json.dumps(metrics), name, number),
            )
            if next_deadline is not None:
                self.db.execute(
                    "INSERT INTO rounds VALUES (?, ?, ?, NULL, ?, NULL, NULL)", (number + 1, now, next_deadline, name)
                )

    def _reclaim(self) -> None:
        """Give the pruned bodies' space back for reuse; the close is committed whatever happens here."""
        self._reclaim_due = False
        try:
            self.db.reclaim()
        except STORAGE_ERRORS as err:
            log.warning("could not reclaim the space of pruned rounds in %s (retried at the next close): %s",
                        self.db.where, err)

    def prune(self, through: int) -> None:
        """Delete the per-round bodies of rounds up to ``through``: updates as received (their rows
        stay, ``body_deleted_at`` set; late ones for old rounds included), the strategy's state and
        the personal messages. Nothing reads them once a later round has closed: the twins keep
        their own bounded history (``twins/``), a restart reads the newest close's state."""
        now = self.clock()
        self.db.execute("DELETE FROM tensors WHERE name IN (SELECT file FROM updates "
                        "WHERE round <= ? AND body_deleted_at IS NULL)", (through,))
        self.db.execute("UPDATE updates SET body_deleted_at=? WHERE round <= ? AND body_deleted_at IS NULL",
                        (now, through))
        done = int(self.meta("pruned_through") or 0)
        for number in range(done + 1, through + 1):
            self.tensors.delete(f"strategy/round_{number:05d}.safetensors")
            for name in self.tensors.names(f"personal/round_{number:05d}"):
                self.tensors.delete(name)
        self.set_meta("pruned_through", str(max(done, through)))
        self._reclaim_due = True

    def forget(self, through: int) -> None:
        """Delete the records of rounds up to ``through``: their update and event rows (and the
        events without a round from before the first round kept) and the global states they were
        announced with; each round's own row stays. Nothing reads them once later rounds closed: a
        late update for such a round is refused (``forgotten_through``)."""
        self.prune(through)
        done = self.forgotten_through()
        if through <= done:
            return
        self.db.execute("DELETE FROM updates WHERE round <= ?", (through,))
        self.db.execute("DELETE FROM events WHERE round <= ?", (through,))
        kept = self.find_round(through + 1)
        if kept is not None:
            self.db.execute("DELETE FROM events WHERE round IS NULL AND at < ?", (kept.opened_at,))
        for number in range(done + 1, through + 1):
            row = self.find_round(number)
            if row is not None:
                self.tensors.delete(row.global_file)
        self.set_meta("forgotten_through", str(through))
        self._forgotten = None  # read again: the batch this runs in may still roll back
        self._reclaim_due = True

    def forgotten_through(self) -> int:
        """The newest round whose records ``forget`` deleted (0: none)."""
        if self._forgotten is None:
            self._forgotten = int(self.meta("forgotten_through") or 0)
        return self._forgotten

    def round(self, number: int) -> RoundRow:
        row = self.find_round(number)
        if row is None:
            raise KeyError(f"no round {number} in the store")
        return row

    def find_round(self, number: int) -> RoundRow | None:
        """Round ``number``, or None where it was never opened here."""
        row = self.db.execute("SELECT * FROM rounds WHERE round=?", (number,)).fetchone()
        return RoundRow(*row[:5], json.loads(row[5]) if row[5] else {}, row[6]) if row else None

    def latest_round(self) -> RoundRow | None:
        row = self.db.execute("SELECT round FROM rounds ORDER BY round DESC LIMIT 1").fetchone()
        return self.round(row[0]) if row else None

    def rounds(self) -> list[RoundRow]:
        return [self.round(r) for (r,) in self.db.execute("SELECT round FROM rounds ORDER BY round")]

    def closed_rounds(self, last: int) -> list[RoundRow]:
        """The ``last`` closed rounds, oldest first."""
        rows = self.db.execute("SELECT round FROM rounds WHERE closed_at IS NOT NULL ORDER BY round DESC LIMIT ?",
                               (last,)).fetchall()
        return [self.round(r) for (r,) in reversed(rows)]

    def extend_deadline(self, number: int, deadline: float) -> None:
        self.db.execute("UPDATE rounds SET deadline=? WHERE round=?", (deadline, number))

    def load_file(self, name: str) -> TensorDict:
        return self.tensors.read(name)

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
        self.tensors.write_body(name, body)
        self.db.execute(
            "INSERT INTO updates (round, client_id, n_samples, file, sha256, metrics, received_at, late) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (number, client_id, n_samples, name, sha256, json.dumps(metrics), self.clock(), int(late)),
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
        return self._update_rows("round=? AND (late=0 OR ?=1) ORDER BY client_id", (number, int(include_late)))

    def late_since(self, at: float) -> list[UpdateRow]:
        """The late updates received after ``at`` whose bodies are kept, oldest round first."""
        return self._update_rows("late=1 AND received_at>? AND body_deleted_at IS NULL ORDER BY round, client_id",
                                 (at,))

    def _update_rows(self, where: str, args: tuple) -> list[UpdateRow]:
        rows = self.db.execute(f"SELECT round, client_id, n_samples, file, sha256, metrics FROM updates WHERE {where}",
                               args)
        return [UpdateRow(*r[:5], json.loads(r[5])) for r in rows]

    def update_bytes(self, number: int) -> int:
        """The size of round ``number``'s stored updates as received (on time and late)."""
        return self.tensors.bytes_below(f"updates/round_{number:05d}")

    def size_bytes(self) -> int:
        """The state's size in its database (on disk for SQLite, as PostgreSQL reports it)."""
        return self.db.size_bytes()

    def load_update(self, row: UpdateRow) -> TensorDict:
        return self.load_file(row.file)

    # per-round files of the strategy -------------------------------------------------------

    def save_strategy_state(self, number: int, state: TensorDict) -> None:
        """What the strategy keeps between rounds, as of the close of ``number`` (written before the
        round is marked closed, so a restart finds the state that matches the last close)."""
        if state:
            self.tensors.write(f"strategy/round_{number:05d}.safetensors", state)

    def strategy_state(self, number: int) -> TensorDict | None:
        name = f"strategy/round_{number:05d}.safetensors"
        return self.tensors.read(name) if self.tensors.exists(name) else None

    def save_personal(self, number: int, client_id: str, tensors: TensorDict) -> None:
        self.tensors.write(f"personal/round_{number:05d}/{client_id}.safetensors", tensors)

    def personal_messages(self, number: int) -> dict[str, TensorDict]:
        """The per-client messages of round ``number`` by client id (none for most strategies)."""
        names = self.tensors.names(f"personal/round_{number:05d}")
        return {PurePosixPath(name).stem: self.tensors.read(name) for name in names}

    # accept / reject log ---------------------------------------------------------------------

    def log(self, kind: str, client_id: str | None, number: int | None, accepted: bool, code: str = "",
            reason: str = "") -> None:
        self.db.execute(
            "INSERT INTO events (at, client_id, round, kind, accepted, code, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (self.clock(), client_id, number, kind, int(accepted), code, reason),
        )

    def refusals_in(self, number: int) -> int:
        """How many messages about round ``number`` were refused (one count, not a log read)."""
        return self.db.execute("SELECT COUNT(*) FROM events WHERE round=? AND accepted=0", (number,)).fetchone()[0]

    def refusal_counts(self, column: str, limit: int | None = None) -> dict:
        """Refused messages counted by ``code`` or ``client_id``, most first (ties by value)."""
        if column not in ("code", "client_id"):
            raise ValueError(f"refusals are counted by code or client_id, not {column!r}")
        query = (f"SELECT {column}, COUNT(*) FROM events WHERE accepted=0 GROUP BY {column} "
                 f"ORDER BY COUNT(*) DESC, {column}" + ("" if limit is None else f" LIMIT {int(limit)}"))
        return dict(self.db.execute(query).fetchall())

    def recent_refusals(self, limit: int) -> list[dict]:
        """The newest ``limit`` refusals, newest first."""
        rows = self.db.execute("SELECT at, client_id, round, kind, accepted, code, reason FROM events "
                               "WHERE accepted=0 ORDER BY id DESC LIMIT ?", (limit,))
        return [dict(zip(EVENT_KEYS, row)) for row in rows]

    def events(self, accepted: bool | None = None) -> list[dict]:
        rows = self.db.execute("SELECT at, client_id, round, kind, accepted, code, reason FROM events ORDER BY id")
        out = [dict(zip(EVENT_KEYS, r)) for r in rows]
        return [e for e in out if accepted is None or bool(e["accepted"]) == accepted]


def open_backend(folder: Path, url: str | None, connection=None):
    """The database of a store and its tensor table: SQLite in ``folder`` when ``url`` is None,
    else PostgreSQL at ``url`` (on ``connection`` when the leader lease already opened one)."""
    if url is None:
        database = SqliteDatabase(folder)
    else:
        from coordinator.store_postgres import PostgresDatabase

        database = PostgresDatabase(url, connection)
    return database, TensorTable(database)
