"""The coordinator's per-message store queries (one row or one count, not a table read) agree
with the whole-table answers they replace, on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

from coordinator.store import Store
from edge_agent.protocol import HelloHeader


def hello(client: str) -> HelloHeader:
    return HelloHeader(fleet="f", sender=client, n_features=2, n_samples=10, model_signature="0" * 16)


def test_registration_presence_and_quorum_queries_match_the_tables(tmp_path: Path) -> None:
    store = Store(tmp_path)
    try:
        for client in ("a", "b", "c", "d"):
            store.register(hello(client))
        store.set_online("d", False)
        with store.batch():
            store.save_update(1, "a", 10, b"x", "0" * 64, {})
            store.save_update(1, "b", 10, b"x", "0" * 64, {}, late=True)
            store.save_update(2, "c", 10, b"x", "0" * 64, {})
        assert store.is_registered("a") and not store.is_registered("zz")
        assert store.client_count() == len(store.clients()) == 4
        online = {c for c, row in store.clients().items() if row.online}
        assert store.online_clients() == online == {"a", "b", "c"}
        for number in (1, 2, 3):
            submitted = {u.client_id for u in store.updates(number)}
            assert store.quorum_state(number) == (len(submitted), len(online - submitted))
        assert store.quorum_state(1) == (1, 2)  # b's late update does not count; d is offline
    finally:
        store.close()
