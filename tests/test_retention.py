"""Retention of per-round bodies on both store backends: a coordinator driven past ``keep_rounds``
deletes the update bodies of older rounds (their rows stay), its twins still impute exactly what an
in-memory engine imputes from the same updates, and the store's size stops growing; past
``keep_records`` the rounds' records go too."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from coordinator.engine import RoundEngine
from coordinator.server import Coordinator
from coordinator.strategies import ClientInfo, ClientUpdate, make_strategy
from edge_agent.protocol import UpdateHeader, encode
from tests.offline import fed, hello_of, message, offline_coordinator, update_of

CLIENTS = ("a", "b", "c", "d", "e", "f")
ROUNDS, KEEP = 9, 2


@pytest.fixture(params=["sqlite", "postgres"])
def store_table(request) -> dict:
    """The [store] table of coordinator.toml: SQLite in state_dir, or a fresh PostgreSQL database."""
    return {"keep_rounds": KEEP, **({"url": request.getfixturevalue("postgres_url")}
                                    if request.param == "postgres" else {})}


def trained(initial: dict[str, torch.Tensor], client: str, number: int) -> dict[str, torch.Tensor]:
    """A client's update of round ``number``: the initial state moved by a seeded small step."""
    generator = torch.Generator().manual_seed(1000 * number + CLIENTS.index(client))
    return {k: v + 0.01 * torch.randn(v.shape, generator=generator).to(v.dtype) if v.is_floating_point() else v
            for k, v in initial.items()}


def send_round(coordinator: Coordinator, number: int, reporting: tuple[str, ...]) -> list[ClientUpdate]:
    """The ``reporting`` clients' updates of round ``number``, then the round's close."""
    updates = [ClientUpdate(c, trained(coordinator.initial, c, number), 50) for c in reporting]
    fed(coordinator, *(update_of(coordinator, u.client_id, number, u.params) for u in updates))
    assert coordinator.close_if_due(coordinator.store.round(number)).round == min(number + 1, ROUNDS)
    return updates


def run_rounds(coordinator: Coordinator) -> list[int]:
    """Every client reports in every round but the last, where "f" is missing and its twin stands
    in; each close equals an in-memory engine's on the same updates (the twin's imputation
    included). Returns the store's size after each close."""
    fed(coordinator, *(hello_of(coordinator, c) for c in CLIENTS))
    replay = RoundEngine(make_strategy(coordinator.cfg, coordinator.initial, coordinator.cfg.seed), coordinator.cfg,
                         robust=coordinator.cfg.robust)
    roster = [ClientInfo(c, 50) for c in CLIENTS]
    state, sizes = coordinator.initial, []
    for number in range(1, ROUNDS + 1):
        reporting = CLIENTS[:-1] if number == ROUNDS else CLIENTS
        if number == ROUNDS:
            fed(coordinator, message("f", "status", b"offline"))
        expected = replay.close(number, state, send_round(coordinator, number, reporting), roster)
        state = expected.global_state
        sizes.append(coordinator.store.size_bytes())
    last = coordinator.store.round(ROUNDS)
    assert last.metrics["imputed"] == ["f"] and expected.imputed == ("f",)
    torch.testing.assert_close(coordinator.store.load_file(last.result_file), state, rtol=0, atol=0)
    return sizes


def test_old_update_bodies_go_twins_still_impute_and_the_store_stops_growing(
        tmp_path: Path, store_table: dict) -> None:
    coordinator = offline_coordinator(tmp_path, ROUNDS, twin="wsf", store=store_table)
    sizes = run_rounds(coordinator)
    store = coordinator.store
    try:
        for number in range(1, ROUNDS + 1):
            assert len(store.updates(number)) == len(CLIENTS) - (number == ROUNDS), number  # the rows stay
            assert bool(store.tensors.names(f"updates/round_{number:05d}")) == (number > ROUNDS - KEEP), number
            assert store.tensors.exists(store.round(number).global_file)
        assert int(store.meta("pruned_through")) == ROUNDS - KEEP
        one_round = store.update_bytes(ROUNDS - 1)
        assert store.tensors.bytes_below("updates") == one_round + store.update_bytes(ROUNDS)
        per_round = (sizes[-1] - sizes[KEEP]) / (ROUNDS - KEEP - 1)  # from the first pruning close on
        assert per_round < one_round / 2, sizes  # what still grows: a global state and a few rows a round
    finally:
        store.close()


def test_records_of_rounds_past_keep_records_go_late_updates_for_them_are_refused_and_the_store_reopens(
        tmp_path: Path, store_table: dict) -> None:
    keep = 4
    coordinator = offline_coordinator(tmp_path, ROUNDS, twin="wsf", store={**store_table, "keep_records": keep})
    run_rounds(coordinator)
    forgotten = ROUNDS - keep
    late = UpdateHeader(fleet="test", sender="a", round=2, n_samples=50, campaign=coordinator.campaign,
                        global_sha256="0" * 64)
    fed(coordinator, message("a", "update", encode(late, coordinator.initial)))
    store = coordinator.store
    try:
        assert store.forgotten_through() == forgotten
        for number in range(1, ROUNDS + 1):
            kept = number > forgotten
            assert bool(store.updates(number)) == kept, number
            assert store.tensors.exists(store.round(number).global_file) == kept, number
            assert store.round(number).closed_at is not None  # every round's own row stays
        assert [e["code"] for e in store.events(accepted=False)] == ["forgotten_round"]
        assert all(e["round"] is None or e["round"] > forgotten for e in store.events(accepted=True))
    finally:
        store.close()
    reopened = offline_coordinator(tmp_path, ROUNDS, twin="wsf", store={**store_table, "keep_records": keep})
    assert reopened.store.latest_round().round == ROUNDS
    reopened.store.close()
