"""The round policy over time (issue 46): exclusion that a hello cannot undo, a quorum that leaves
a small fleet one straggler's slot (its late update counted in the next close), and min_clients
counted after the screen. The policy alone, then a coordinator with a real store and no broker,
driven message by message (closes come from the messages, not from sleeps)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from coordinator.broker_setup import free_port
from coordinator.server import Coordinator
from coordinator.strategies import RoundPolicy
from coordinator.strategy_settings import ParticipationSettings
from coordinator.strategies.participation import Progress, Standing
from tests.fleet import SEED, coordinator_config
from tests.offline import closes, fed, hello_of, message, offline_coordinator, resumed, turn_until, update_of

FLEET = ("a", "b", "c", "d")


def test_the_quorum_leaves_a_straggler_slot_from_three_participants() -> None:
    """0.8 of 4 rounded up is 4; the rule leaves one out from 3 participants on (unless quorum
    is 1), never below min_clients: a 4-client round with one silent device closes at quorum + grace."""
    policy = RoundPolicy(ParticipationSettings(), 1, SEED)
    assert [policy.quorum(n) for n in (1, 2, 3, 4, 5, 10, 100)] == [1, 2, 2, 3, 4, 8, 80]
    assert RoundPolicy(ParticipationSettings(), 4, SEED).quorum(4) == 4
    assert RoundPolicy(ParticipationSettings(quorum=1.0), 1, SEED).quorum(4) == 4  # opting out: wait for all
    silent = Progress(3, 1, 100.0, 104.0)  # 3 of 4 reported 4 s after the announcement
    assert policy.close_reason(silent, 4, 400.0, 105.9) is None
    assert policy.close_reason(silent, 4, 400.0, 106.0) == "quorum + grace"


def test_an_excluded_device_is_asked_again_after_doubling_time_outs_until_it_reports_on_time() -> None:
    """A device asked and silent every time: rounds 1-3, then once after 3 rounds out, 6, 12...;
    one on-time update (asked or not) clears its record."""
    policy = RoundPolicy(ParticipationSettings(exclude_after=3), 1, SEED)
    standing: dict[str, Standing] = {}
    asked = []
    for number in range(1, 31):
        if "d" not in policy.excluded(standing, number):
            asked.append(number)
        participants = [c for c in FLEET if c not in policy.excluded(standing, number)]
        standing = policy.standings([(number, participants, ["a", "b", "c"])], standing)
    assert asked == [1, 2, 3, 7, 14, 27]
    assert standing == {"d": Standing(6, 4, 52)}
    assert policy.standings([(31, ["a", "b", "c"], ["a", "b", "c", "d"])], standing) == {}


def reported(coordinator: Coordinator, number: int, clients: tuple[str, ...], moved: float = 0.0) -> None:
    """``clients``' on-time updates of round ``number`` (the initial state, moved by ``moved``)."""
    params = {k: v + moved if v.is_floating_point() else v for k, v in coordinator.initial.items()}
    fed(coordinator, *(update_of(coordinator, c, number, params) for c in clients))


def test_a_hello_every_3_rounds_does_not_readmit_an_excluded_silent_device(tmp_path: Path) -> None:
    """"d" registers, stays online and never sends an update, only a hello after every third
    round: it is asked in rounds 1-3, then only once its time out ends (7, 14), and the other
    three's rounds close at quorum + grace while it is asked."""
    coordinator = offline_coordinator(tmp_path, rounds=14)
    fed(coordinator, *(hello_of(coordinator, c) for c in FLEET))
    rows = []
    for number in range(1, 15):
        reported(coordinator, number, FLEET[:3])
        rows.append(closes(coordinator, number))
        if number % 3 == 0:
            fed(coordinator, hello_of(coordinator, "d"))
    assert [row.round for row in rows if "d" in row.metrics["asked"]] == [1, 2, 3, 7, 14]
    assert {row.metrics["closed_by"] for row in rows if "d" in row.metrics["asked"]} == {"quorum + grace"}
    assert {row.metrics["closed_by"] for row in rows if "d" not in row.metrics["asked"]} == {
        "all participants reported"}
    assert coordinator.participants.standing["d"].strikes == 3  # kept in the store: a restart reads it
    coordinator.store.close()
    assert resumed(coordinator.cfg).participants.standing == {"d": Standing(5, 3, 27)}


def test_a_4_client_fleet_with_a_straggler_closes_at_quorum_plus_grace_and_counts_its_late_update(
    tmp_path: Path
) -> None:
    """Default policy, four clients: "d" is on time in round 1, late in round 2 (the round closes
    at quorum + grace, not at its 60 s deadline), silent in round 3, where its late round-2
    update stands in for it (recorded as ``stale``; without it "d" is dropped: twin "drop")."""
    coordinator = offline_coordinator(tmp_path, rounds=3)
    fed(coordinator, *(hello_of(coordinator, c) for c in FLEET))
    reported(coordinator, 1, FLEET)
    assert closes(coordinator, 1).metrics["closed_by"] == "all participants reported"
    reported(coordinator, 2, FLEET[:3])
    second = closes(coordinator, 2)
    assert second.metrics["closed_by"] == "quorum + grace" and second.closed_at < second.deadline
    reported(coordinator, 2, ("d",), moved=0.01)
    assert [e["code"] for e in coordinator.store.events(accepted=True) if e["client_id"] == "d"][-1] == "late"
    reported(coordinator, 3, FLEET[:3])
    third = closes(coordinator, 3)
    assert third.metrics["stale"] == ["d"] and third.metrics["imputed"] == [] and third.metrics["dropped"] == []
    moved = coordinator.store.load_file(third.result_file)
    assert any(not torch.equal(moved[k], v) for k, v in coordinator.initial.items() if v.is_floating_point())
    coordinator.store.close()


def test_a_round_with_fewer_screened_updates_than_min_clients_does_not_aggregate(tmp_path: Path) -> None:
    """min_clients = 2; "a" and "b" report, then "b" is revoked (coordinator.toml rewritten, its
    reload taken in a turn): the screen leaves 1 update, so the round is not aggregated, waits on
    past its deadline (extended), and closes once "c" reports, from "a" and "c"."""
    closed = {"min_clients": 2, "registration": "closed"}
    coordinator = offline_coordinator(tmp_path, rounds=2, allowed_clients=["a", "b", "c"], **closed)
    fed(coordinator, *(hello_of(coordinator, c) for c in ("a", "b")))
    reported(coordinator, 1, ("a", "b"))
    coordinator_config(tmp_path, free_port(), 2, allowed_clients=["a", "c"], **closed)
    turn_until(lambda: not coordinator.access.allows("b"), coordinator.turn, "the allow-list reloaded")
    assert not coordinator.store.clients()["b"].online  # revoked: no round waits for it
    assert coordinator.close_if_due(coordinator.store.round(1)).round == 1
    coordinator.store.extend_deadline(1, time.time() - 1.0)  # the deadline passes
    assert coordinator.close_if_due(coordinator.store.round(1)).round == 1
    row = coordinator.store.round(1)
    assert row.closed_at is None and row.deadline > time.time()  # extended, still open
    fed(coordinator, hello_of(coordinator, "c"), message("c", "status", b"online"))
    reported(coordinator, 1, ("c",))
    first = closes(coordinator, 1)
    assert first.metrics["clients"] == ["a", "c"] and first.metrics["rejected"] == {"b": "unregistered"}
    coordinator.store.close()
