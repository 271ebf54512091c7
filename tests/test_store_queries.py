"""The coordinator's store on both backends (SQLite and PostgreSQL, tensors in the
database): per-message queries agree with whole-table answers, tensors round-trip, a rolled-back
message or batch leaves nothing behind, and the state survives reopening."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coordinator.intake import Refusal, record
from coordinator.store import Store
from edge_agent.protocol import HelloHeader
from safetensors.torch import save


def hello(client: str) -> HelloHeader:
    return HelloHeader(fleet="f", sender=client, n_features=2, n_samples=10, model_signature="0" * 16)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request) -> str | None:
    """None for the default SQLite store, else a fresh PostgreSQL database."""
    return None if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def test_registration_presence_and_quorum_queries_match_the_tables(tmp_path: Path, url: str | None) -> None:
    store = Store(tmp_path, url)
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
            assert store.quorum_state(number) == (len(submitted), online - submitted)
        assert store.quorum_state(1) == (1, {"b", "c"})  # b's late update does not count; d is offline
        assert [u.client_id for u in store.updates(1, include_late=True)] == ["a", "b"]
        assert store.last_reported() == {"a": 1, "b": 1, "c": 2}
    finally:
        store.close()


def test_rounds_tensors_and_reopening(tmp_path: Path, url: str | None) -> None:
    initial, result = {"w": torch.arange(6.0).reshape(2, 3)}, {"w": torch.full((2, 3), 0.5)}
    store = Store(tmp_path, url)
    campaign = store.campaign()
    try:
        store.register(hello("a"))
        first = store.open_first_round(123.0, initial)
        with store.batch():
            store.save_update(1, "a", 10, save({"w": torch.ones(2, 3)}), "0" * 64, {"loss": 0.25})
        store.save_strategy_state(1, {"m": torch.tensor([1.0, 2.0])})
        store.save_personal(1, "a", {"p": torch.tensor([3.0])})
        store.save_personal(1, "b_2", {"p": torch.tensor([4.0])})
        store.finish_round(1, {"clients": ["a"]}, result, next_deadline=456.0)
    finally:
        store.close()
    again = Store(tmp_path, url)
    try:
        assert again.campaign() == campaign
        assert first.round == 1 and first.deadline == 123.0
        torch.testing.assert_close(again.load_file(again.round(1).global_file), initial)
        torch.testing.assert_close(again.load_file(again.round(1).result_file), result)
        assert again.latest_round().round == 2 and again.latest_round().closed_at is None
        torch.testing.assert_close(again.load_file(again.round(2).global_file), result)
        (update,) = again.updates(1)
        assert update.metrics == {"loss": 0.25}
        torch.testing.assert_close(again.load_update(update), {"w": torch.ones(2, 3)})
        torch.testing.assert_close(again.strategy_state(1), {"m": torch.tensor([1.0, 2.0])})
        assert again.strategy_state(2) is None
        assert sorted(again.personal_messages(1)) == ["a", "b_2"] and again.personal_messages(2) == {}
        assert again.last_on_time() == {"a": 1}
    finally:
        again.close()


def test_a_failed_message_or_batch_leaves_nothing_behind(tmp_path: Path, url: str | None) -> None:
    store = Store(tmp_path, url)
    try:
        with store.batch():
            store.save_update(1, "kept", 10, save({"w": torch.ones(1)}), "0" * 64, {})
            with pytest.raises(ValueError), store.savepoint():
                store.save_update(1, "failed", 10, save({"w": torch.ones(1)}), "0" * 64, {})
                raise ValueError("refused after its writes")
            store.log("update", "kept", 1, True)
        with pytest.raises(RuntimeError), store.batch():
            store.save_update(2, "kept", 10, save({"w": torch.ones(1)}), "0" * 64, {})
            raise RuntimeError("the batch fails")
        assert [u.client_id for u in store.updates(1)] == ["kept"] and store.updates(2) == []
        assert [e["client_id"] for e in store.events()] == ["kept"]
        assert store.tensors.names("updates/round_00001") == ["updates/round_00001/kept.safetensors"]
        assert store.tensors.names("updates/round_00002") == []
    finally:
        store.close()


def test_a_refusal_whatever_its_reason_holds_is_logged(tmp_path: Path, url: str | None) -> None:
    store = Store(tmp_path, url)
    try:
        record(store, "update", "a", Refusal.of("internal", "a NUL \x00 and a lone surrogate \ud800"))
        assert [e["reason"] for e in store.events(accepted=False)] == ["a NUL \\x00 and a lone surrogate ?"]
    finally:
        store.close()


def test_refusals_are_counted_in_the_database_like_the_log_reads(tmp_path: Path, url: str | None) -> None:
    store = Store(tmp_path, url)
    try:
        for client, code, number in (("a", "bad_magic", 1), ("b", "bad_magic", 1), ("a", "too_large", 2)):
            store.log("update", client, number, False, code, "refused")
        store.log("update", "c", 1, True)
        refused = store.events(accepted=False)
        assert store.refusal_counts("code") == {"bad_magic": 2, "too_large": 1}
        assert store.refusal_counts("client_id") == {"a": 2, "b": 1}
        assert store.refusal_counts("client_id", limit=1) == {"a": 2}
        assert store.recent_refusals(2) == refused[::-1][:2] and store.refusals_in(1) == 2
        with pytest.raises(ValueError, match="code or client_id"):
            store.refusal_counts("reason; DROP TABLE events")
    finally:
        store.close()
