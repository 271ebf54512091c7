"""The buffered round policy (FedBuff, issue 46): the engine's arithmetic by hand (K updates,
staleness-scaled changes, the server learning rate), the close rule counting held late updates,
the timed simulation's schedule, and simulations where it must equal synchronous FedAvg or must
keep a straggler that synchronous rounds drop."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from coordinator.engine import RoundEngine
from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.timing import timed
from coordinator.strategies import ClientInfo, ClientUpdate, RoundPolicy, make_strategy
from coordinator.strategy_settings import BufferSettings, ParticipationSettings, RobustSettings, StrategySettings
from coordinator.strategies.participation import Progress
from coordinator.twin_settings import TwinSettings
from edge_agent.data import prepare_client, synthetic_clients
from tests.conftest import small_config

NO_BOUNDS = RobustSettings(clip_factor=None, reject_factor=None, weight_factor=None)
ROSTER = [ClientInfo("a", 10), ClientInfo("b", 30), ClientInfo("c", 20), ClientInfo("d", 20)]
ZERO = {"w": torch.zeros(2, dtype=torch.float64)}


def engine(buffer: BufferSettings | None) -> RoundEngine:
    return RoundEngine(make_strategy(StrategySettings(), ZERO, 0), TwinSettings(twin="drop"), robust=NO_BOUNDS,
                       buffer=buffer)


def moved(state: dict[str, torch.Tensor], by: list[float]) -> dict[str, torch.Tensor]:
    return {"w": state["w"] + torch.tensor(by, dtype=torch.float64)}


def test_a_buffered_close_applies_the_staleness_scaled_mean_change_times_the_server_lr() -> None:
    """Round 1: a, b, c report; d, never on time, sends its round-1 update (change [2, -2]) after
    the close: held all the same. Round 2: a and b report, c is silent; d's change enters scaled
    by 1/sqrt(2) with its own weight, and the state moves by half the mean change."""
    buffered = engine(BufferSettings(size=3, server_lr=0.5))
    first = buffered.close(1, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10),
                                     ClientUpdate("b", moved(ZERO, [0, 1]), 30),
                                     ClientUpdate("c", moved(ZERO, [1, 1]), 20)], ROSTER)
    w1 = torch.tensor([0.5 * 30 / 60, 0.5 * 50 / 60], dtype=torch.float64)
    torch.testing.assert_close(first.global_state["w"], w1, rtol=0, atol=1e-15)
    assert buffered.observe_late(ClientUpdate("d", moved(ZERO, [2, -2]), 20), 1, ZERO)
    assert buffered.held(2) == ["d"]
    second = buffered.close(2, first.global_state, [ClientUpdate("a", moved(first.global_state, [1, 0]), 10),
                                                    ClientUpdate("b", moved(first.global_state, [0, 1]), 30)], ROSTER)
    s = 1 / math.sqrt(2)
    change = torch.tensor([10 * 1 + 20 * s * 2, 30 * 1 - 20 * s * 2], dtype=torch.float64) / 60
    torch.testing.assert_close(second.global_state["w"], w1 + 0.5 * change, rtol=0, atol=1e-15)
    assert second.stale == ("d",) and second.dropped == ("c",) and second.on_time == ("a", "b")


def test_synchronous_rounds_drop_what_the_buffer_keeps_and_old_updates_leave_the_buffer() -> None:
    """The same late update under synchronous rounds: not kept (d was never on time). Under the
    buffer with max_staleness 1, a round-1 update arriving before round 3's close is left out."""
    synchronous = engine(None)
    synchronous.close(1, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10)], ROSTER)
    assert not synchronous.observe_late(ClientUpdate("d", moved(ZERO, [2, -2]), 20), 1, ZERO)
    assert synchronous.close(2, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10)], ROSTER).stale == ()

    bounded = engine(BufferSettings(max_staleness=1, staleness_exponent=0.0))
    bounded.close(1, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10)], ROSTER)
    bounded.close(2, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10)], ROSTER)
    assert bounded.observe_late(ClientUpdate("d", moved(ZERO, [2, -2]), 20), 1, ZERO)
    assert bounded.held(3) == []
    third = bounded.close(3, ZERO, [ClientUpdate("a", moved(ZERO, [1, 0]), 10)], ROSTER)
    assert third.stale == () and "d" in third.dropped


def test_the_buffered_close_rule_counts_held_late_updates_toward_k() -> None:
    """K = 3 of 4: two on-time updates and one held late one close the round at once; the
    synchronous rule ignores the held one and waits for quorum + grace."""
    buffered = RoundPolicy(ParticipationSettings(policy="buffered", buffer=BufferSettings(size=3)), 1, 0)
    assert buffered.close_reason(Progress(2, 2, 0.0, None, 1), 4, 100.0, 1.0) == "buffer full"
    assert buffered.close_reason(Progress(2, 2, 0.0, None, 0), 4, 100.0, 1.0) is None
    assert buffered.close_reason(Progress(3, 1, 0.0, 1.0), 4, 100.0, 50.0) == "buffer full"
    assert buffered.close_reason(Progress(2, 2, 0.0, None), 4, 100.0, 100.0) == "deadline"
    synchronous = RoundPolicy(ParticipationSettings(), 1, 0)
    assert synchronous.close_reason(Progress(2, 2, 0.0, None, 1), 4, 100.0, 1.0) is None
    assert RoundPolicy(ParticipationSettings(policy="buffered"), 1, 0).buffer_size(4) == 3  # the quorum's count
    with pytest.raises(ValidationError, match="policy = 'buffered'"):
        ParticipationSettings(buffer=BufferSettings(size=3))


def test_the_timed_schedule_closes_buffered_rounds_on_k_and_folds_the_straggler_in() -> None:
    """Durations 1, 1.2, 1.5 and 5 s. Synchronous: rounds 1-3 close at quorum + grace (1.5 s +
    0.75 s) without the straggler, whose round-1 update arrives in round 3; having missed 3 rounds
    it is not waited for in rounds 4-6 (those close once the other three reported: 1.5 s), and
    asked again in round 7. Buffered, K = 3: rounds close when the third update is in (1.5 s),
    and round 4 closes at 5.7 s on two on-time updates and the straggler's round-1 update, which
    arrived at 5 s."""
    durations = [1.0, 1.2, 1.5, 5.0]
    synchronous = timed(RoundPolicy(ParticipationSettings(), 1, 0), durations, 7, 30.0)
    assert synchronous.closed_at == pytest.approx((2.25, 4.5, 6.75, 8.25, 9.75, 11.25, 13.5))
    assert synchronous.closed_by == ("quorum + grace",) * 3 + ("all participants reported",) * 3 + ("quorum + grace",)
    assert synchronous.participation.late[0, 3] == 1 and synchronous.participation.arrival[0, 3] == 3
    settings = ParticipationSettings(policy="buffered", buffer=BufferSettings(size=3))
    buffered = timed(RoundPolicy(settings, 1, 0), durations, 5, 30.0)
    assert buffered.closed_at == pytest.approx((1.5, 3.0, 4.5, 5.7, 6.9))
    assert set(buffered.closed_by) == {"buffer full"}
    assert buffered.participation.arrival[0, 3] == 4 and buffered.participation.present[3].tolist() == [1, 1, 0, 0]


@pytest.fixture(scope="module")
def fleet():
    tables = synthetic_clients(n_clients=3, n_features=3, n_steps=400, seed=2)
    return [prepare_client(t, 24, 12, stride=6) for t in tables]


def test_buffered_rounds_with_k_all_clients_and_no_straggler_equal_synchronous_fedavg(fleet) -> None:
    """Every update on time (t = 0: passed unchanged), K = 3 of 3, server_lr 1: the same bits."""
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=3, batch_size=32, seed=9, test_every_round=False)
    plain = run_federation(fleet, cfg, fed)
    buffered = fed.model_copy(update={"participation": ParticipationSettings(policy="buffered",
                                                                             buffer=BufferSettings(size=3))})
    result = run_federation(fleet, cfg, buffered)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(plain.states, result.states) for k in a)


def test_a_simulated_straggler_is_folded_in_by_the_buffer_and_dropped_by_synchronous_rounds(fleet) -> None:
    """Client 2 takes four times as long: synchronous rounds close at quorum + grace without it
    and drop its late updates (never on time); the buffer (K = 2) takes them, scaled."""
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=5, batch_size=32, seed=9, test_every_round=False)
    durations = [1.0, 1.1, 4.0]
    synchronous = timed(RoundPolicy(fed.participation, 1, fed.seed), durations, fed.rounds, 60.0)
    plain = run_federation(fleet, cfg, fed, participation=synchronous.participation)
    assert all(r.stale == () for r in plain.records) and any(r.late == (fleet[2].name,) for r in plain.records)
    settings = ParticipationSettings(policy="buffered", buffer=BufferSettings(size=2))
    buffered = fed.model_copy(update={"participation": settings})
    schedule = timed(RoundPolicy(settings, 1, fed.seed), durations, fed.rounds, 60.0)
    result = run_federation(fleet, cfg, buffered, participation=schedule.participation)
    assert any(r.stale == (fleet[2].name,) for r in result.records)
    assert schedule.closed_at[-1] < synchronous.closed_at[-1]
