"""The store's schema version on both backends: a store written with the schema edgefl had before
versioning (version 1) upgrades on opening with its data intact, a failed migration changes
nothing, and a store of a newer version is refused naming the database and both versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from coordinator.store import Store, open_backend
from coordinator.store_schema import LATEST, SCHEMA_V1, stored_version
from edge_agent.storage import StateDirError

UPDATE = {"w": torch.arange(6.0).reshape(2, 3)}


@pytest.fixture(params=["sqlite", "postgres"])
def url(request) -> str | None:
    """None for the default SQLite store, else a fresh PostgreSQL database."""
    return None if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def version_1_store(folder: Path, url: str | None) -> None:
    """A store as edgefl wrote it before versioning: the version-1 tables, one round with one update
    (8 columns, no retention column), its tensors, a client, the campaign and an event."""
    database, _ = open_backend(folder, url)
    for statement in SCHEMA_V1:
        database.execute(database.ddl(statement))
    rows = [
        ("INSERT INTO clients VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?)", ("a", 2, 10, 52.1, 4.3, "0" * 16, 1.0, 2.0)),
        ("INSERT INTO rounds VALUES (?, ?, ?, NULL, ?, NULL, NULL)", (1, 1.0, 9e9, "global/round_00001.safetensors")),
        ("INSERT INTO tensors VALUES (?, ?)", ("global/round_00001.safetensors", save({"w": torch.zeros(2, 3)}))),
        ("INSERT INTO tensors VALUES (?, ?)", ("updates/round_00001/a.safetensors", save(UPDATE))),
        ("INSERT INTO updates VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
         (1, "a", 10, "updates/round_00001/a.safetensors", "f" * 64, json.dumps({"loss": 0.5}), 3.0, 0)),
        ("INSERT INTO meta VALUES (?, ?)", ("campaign", "20250101T000000Z-abcdef")),
        ("INSERT INTO events (at, client_id, round, kind, accepted, code, reason) VALUES (?, ?, ?, ?, ?, ?, ?)",
         (3.0, "a", 1, "update", 1, "", "")),
    ]
    for sql, params in rows:
        database.execute(sql, params)
    database.close()


def test_a_version_1_store_upgrades_with_its_data_intact(tmp_path: Path, url: str | None) -> None:
    version_1_store(tmp_path, url)
    store = Store(tmp_path, url, keep_rounds=1)
    try:
        assert stored_version(store.db) == LATEST
        assert store.campaign() == "20250101T000000Z-abcdef"
        (update,) = store.updates(1)
        assert (update.client_id, update.n_samples, update.metrics) == ("a", 10, {"loss": 0.5})
        torch.testing.assert_close(store.load_update(update), UPDATE)
        assert store.clients()["a"].latitude == 52.1 and store.events()[0]["kind"] == "update"
        store.finish_round(1, {"clients": ["a"]}, {"w": torch.ones(2, 3)}, 9e9)
        store.finish_round(2, {"clients": []}, {"w": torch.ones(2, 3)}, 9e9)  # round 1 falls out of the window
        assert store.updates(1) == [update] and not store.tensors.exists(update.file)
    finally:
        store.close()
    reopened = Store(tmp_path, url)
    assert stored_version(reopened.db) == LATEST and reopened.latest_round().round == 3
    reopened.close()


def test_a_failed_migration_changes_nothing(tmp_path: Path, url: str | None) -> None:
    version_1_store(tmp_path, url)
    database, _ = open_backend(tmp_path, url)
    database.execute("ALTER TABLE updates ADD COLUMN body_deleted_at TEXT")  # in the way of migration 2
    database.close()
    with pytest.raises(StateDirError, match="migrating the store schema to version 2 failed, nothing was changed"):
        Store(tmp_path, url)
    database, _ = open_backend(tmp_path, url)
    assert stored_version(database) == 1 and "schema_version" not in database.tables()
    database.close()


def test_a_newer_store_is_refused_naming_the_database_and_both_versions(tmp_path: Path, url: str | None) -> None:
    Store(tmp_path, url).close()
    database, _ = open_backend(tmp_path, url)
    database.execute("INSERT INTO schema_version VALUES (?, ?)", (LATEST + 1, 0.0))
    database.close()
    with pytest.raises(StateDirError) as refused:
        Store(tmp_path, url)
    message = str(refused.value)
    where = str(tmp_path / "coordinator.sqlite3") if url is None else url.rsplit("/", 1)[1]
    assert where in message and f"version {LATEST + 1}, newer than the {LATEST}" in message
