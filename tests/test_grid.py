"""The simulated grid (issue 47): simulations run the coordinator service's own loop over an
in-memory broker and a simulated clock. Where the service's round policy and the engine-only
driver it replaced agree, every round's global state is bit for bit that driver's, under full
participation, FedDTW's dropout scenarios (rounds nobody reports in included), late updates,
Fed-GAME, client sampling and the buffered policy."""

from __future__ import annotations

import queue
from collections import defaultdict

import pytest
import torch

from coordinator.engine import RoundEngine
from coordinator.simulation.federation import head_learners, run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.grid import SimulatedClock, WaitingInbox
from coordinator.simulation.participation import Participation, everyone, participation, policy_driven
from coordinator.strategies import ClientInfo, ClientUpdate, RoundPolicy, make_strategy
from coordinator.strategy_settings import ParticipationSettings
from coordinator.strategies.participation import Progress
from edge_agent.data import prepare_client, synthetic_clients
from edge_agent.learners.head import initial_shared_state
from edge_agent.tensors import TensorDict
from tests.conftest import small_config

CONFIG = small_config("dlinear")
ROUNDS = 5


@pytest.fixture(scope="module")
def fleet():
    tables = synthetic_clients(n_clients=5, n_features=4, n_steps=500, seed=11)
    subsets = [[0], [0, 1, 2], [1, 2, 3], [3], [0, 2]]
    return [prepare_client(t.select([t.columns[i] for i in s]), 24, 12, stride=4) for t, s in zip(tables, subsets)]


def engine_only(fleet, fed: FederationConfig, plan: Participation) -> list[TensorDict]:
    """Every round's global state as the simulation closed rounds before the grid: the round
    engine called directly on the schedule's on-time updates, late ones handed to it in the
    round they arrive, every learner given the new state and its personal message. (It does not
    evaluate between rounds, so it stands for the grid only with models that evaluation leaves
    unchanged, as DLinear.)"""
    learners = head_learners(fleet, CONFIG, fed, fed.seed)
    roster = [ClientInfo(c.name, c.n_train) for c in fleet]
    state = initial_shared_state(CONFIG, fed.seed)
    engine = RoundEngine(make_strategy(fed, state, fed.seed), fed, robust=fed.robust,
                         buffer=fed.participation.buffering)
    states, pending = [], defaultdict(list)
    for number in range(1, plan.rounds + 1):
        on_time = []
        for i in plan.training(number):
            learners[i].load_global(state)
            loss = learners[i].train(number)
            update = ClientUpdate(roster[i].client_id, learners[i].wire_state(number), learners[i].n_samples,
                                  {"loss": loss})
            if plan.present[number - 1, i]:
                on_time.append(update)
            else:
                pending[plan.arrival_round(number, i)].append((number, update, state))
        for trained_in, update, trained_from in pending.pop(number, []):
            engine.observe_late(update, trained_in, trained_from)
        result = engine.close(number, state, on_time, [roster[i] for i in plan.asked_in(number)])
        state = result.global_state
        for learner, client in zip(learners, roster):
            learner.load_global(state)
            if client.client_id in result.personal:
                learner.install_personal(result.personal[client.client_id])
        states.append(state)
    return states


CASES = {
    "full participation": ({}, lambda n: everyone(ROUNDS, n)),
    "random dropout, twins": ({"twin": "wsf"}, lambda n: participation("rcd", ROUNDS, n, 0.5, 3)),
    "delays, late updates kept": ({"twin": "wsf", "late_updates": "next_round"},
                                  lambda n: participation("du", ROUNDS, n, 0.5, 3)),
    "partitions, rounds nobody reports in": ({"twin": "wsf"}, lambda n: participation("np", ROUNDS, n, 0.8, 5)),
    "fedgame": ({"strategy": "fedgame"}, lambda n: everyone(ROUNDS, n)),
    "buffered": ({"participation": {"policy": "buffered"}}, lambda n: participation("du", ROUNDS, n, 0.5, 3)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_service_loop_gives_the_engine_only_rounds_bit_for_bit(fleet, case: str) -> None:
    settings, plan_of = CASES[case]
    fed = FederationConfig(rounds=ROUNDS, batch_size=32, seed=3, test_every_round=False, **settings)
    plan = plan_of(len(fleet))
    result = run_federation(fleet, CONFIG, fed, participation=plan)
    expected = engine_only(fleet, fed, plan)
    assert len(result.states) == len(expected) == ROUNDS
    for number, (got, want) in enumerate(zip(result.states, expected), 1):
        assert all(torch.equal(got[k], want[k]) for k in want), f"{case}: round {number} differs"
    on_time = [len(r.present) for r in result.records]
    assert on_time == [int(row.sum()) for row in plan.present], "the schedule's on-time updates closed each round"
    assert all(r.wire_bytes > 0 for r, row in zip(result.records, plan.present) if row.any())


def test_sampled_rounds_ask_the_clients_the_coordinator_draws(fleet) -> None:
    fed = FederationConfig(rounds=ROUNDS, batch_size=32, seed=3, test_every_round=False,
                           participation={"fraction": 0.4})
    result = run_federation(fleet, CONFIG, fed)
    plan = policy_driven(RoundPolicy(fed.participation, 1, fed.seed), ROUNDS, [c.name for c in fleet])
    assert [set(r.present) for r in result.records] == [
        {fleet[i].name for i in plan.training(n)} for n in range(1, ROUNDS + 1)]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(result.states, engine_only(fleet, fed, plan)) for k in a)


def test_a_round_nobody_reported_in_closes_only_at_its_deadline_without_a_quorum() -> None:
    """min_clients = 0 (the simulated fleet's): no participant left to wait for is no reason to
    close an empty round early; with min_clients = 1 it waits past its deadline, as before."""
    nobody = Progress(0, 0, 100.0, None)
    assert RoundPolicy(ParticipationSettings(), 0, 1).close_reason(nobody, 0, 160.0, 159.9) is None
    assert RoundPolicy(ParticipationSettings(), 0, 1).close_reason(nobody, 0, 160.0, 160.0) == "deadline"
    assert RoundPolicy(ParticipationSettings(), 1, 1).close_reason(nobody, 0, 160.0, 999.0) is None


def test_the_simulated_clock_moves_only_when_the_service_waits_on_an_empty_inbox() -> None:
    clock, calls = SimulatedClock(start=10.0), []
    inbox = WaitingInbox(lambda timeout: (calls.append(timeout), clock.advance(timeout)))
    inbox.put("m")
    assert inbox.get(timeout=0.05) == "m" and clock() == 10.0 and calls == []
    with pytest.raises(queue.Empty):
        inbox.get(timeout=0.05)
    assert clock() == 10.05 and calls == [0.05]
    inbox.put("n")
    assert inbox.get_nowait() == "n" and calls == [0.05], "a non-blocking read never waits"
