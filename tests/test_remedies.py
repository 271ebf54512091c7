"""Remedies for FedAvg's averaging penalty and the never-worse-than-alone companion, on small
synthetic fleets: each behaviour checked against what it promises."""

from __future__ import annotations

import math

import pytest
import torch

from coordinator.simulation.baselines import TrainingBudget, run_local_only
from coordinator.simulation.federation import head_learners, run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.strategies import ClientUpdate, make_strategy, weighted_mean
from coordinator.strategy_settings import ServerSettings, StrategySettings
from edge_agent.data import prepare_client, synthetic_clients
from edge_agent.learners.head import client_model, initial_shared_state
from edge_agent.train import evaluate, forecast_loss
from edge_agent.training_settings import HeadTraining
from tests.conftest import small_config, train_clients


@pytest.fixture(scope="module")
def fleet():
    tables = synthetic_clients(n_clients=3, n_features=4, n_steps=600, seed=5)
    subsets = [[0], [0, 1, 2], [1, 2, 3]]
    return [prepare_client(t.select([t.columns[i] for i in s]), 24, 12, stride=3) for t, s in zip(tables, subsets)]


def test_fitting_the_personal_part_to_the_installed_global_state_shrinks_the_jump(fleet) -> None:
    """After a round, installing the average under heads trained against each client's own shared
    part raises their validation error; the personal phase (FedRep) takes much of it back."""
    cfg = small_config("dlinear", dropout=0.0)
    training = HeadTraining(batch_size=16, lr=3e-3, local_epochs=2, personal_epochs=2)
    learners = head_learners(fleet, cfg, training, seed=1)
    updates = train_clients(learners, initial_shared_state(cfg, 1), 1)
    own = [evaluate(lr.model, c.val).score for lr, c in zip(learners, fleet)]
    for learner in learners:
        learner.load_global(weighted_mean(updates))
    installed = [evaluate(lr.model, c.val).score for lr, c in zip(learners, fleet)]
    adapted = [lr.serving_model(2).scores["federated"] for lr in learners]
    assert sum(installed) > sum(own)  # the averaging penalty
    assert sum(adapted) < sum(installed)
    assert all(torch.equal(lr.model.shared_state()[k], weighted_mean(updates)[k])  # serving copies, never trains
               for lr in learners for k in updates[0].params)


def test_alternation_trains_only_the_shared_part_after_the_personal_phase(fleet) -> None:
    cfg = small_config("dlinear")
    learners = head_learners(fleet[:1], cfg, HeadTraining(batch_size=16, alternate=True), seed=2)
    before = learners[0].model.personal_state()
    train_clients(learners, initial_shared_state(cfg, 2), 1)
    after = learners[0].model.personal_state()
    assert all(torch.equal(before[k], after[k]) for k in before)  # personal_epochs 0: the head never moved
    moved = HeadTraining(batch_size=16, alternate=True, personal_epochs=1)
    learners = head_learners(fleet[:1], cfg, moved, seed=2)
    train_clients(learners, initial_shared_state(cfg, 2), 1)
    assert any(not torch.equal(before[k], learners[0].model.personal_state()[k]) for k in before)


def test_the_proximal_term_holds_the_shared_part_near_the_received_one(fleet) -> None:
    cfg, start = small_config("dlinear"), initial_shared_state(small_config("dlinear"), 3)

    def drift(mu: float) -> float:
        learners = head_learners(fleet[1:2], cfg, HeadTraining(batch_size=16, lr=1e-2, local_epochs=3, prox_mu=mu), 3)
        update = train_clients(learners, start, 1)[0].params
        return sum((update[k] - start[k]).pow(2).sum().item() for k in start)

    assert drift(100.0) < 0.2 * drift(0.0)


def states(*values: float) -> list[ClientUpdate]:
    return [ClientUpdate(f"c{i}", {"w": torch.tensor([v]), "bn.running_var": torch.tensor([v])}, 1)
            for i, v in enumerate(values)]


def test_server_momentum_with_no_momentum_and_lr_one_is_fedavg_and_keeps_its_velocity() -> None:
    current = {"w": torch.tensor([0.0]), "bn.running_var": torch.tensor([1.0])}
    plain = make_strategy(StrategySettings(strategy="fedavgm", server=ServerSettings(lr=1.0, momentum=0.0)), current, 0)
    out = plain.aggregate(1, current, states(2.0, 4.0), [], {}).global_state
    torch.testing.assert_close(out["w"], torch.tensor([3.0]))
    heavy = make_strategy(StrategySettings(strategy="fedavgm", server=ServerSettings(lr=0.5, momentum=0.9)), current, 0)
    first = heavy.aggregate(1, current, states(2.0, 4.0), [], {}).global_state
    torch.testing.assert_close(first["w"], torch.tensor([1.5]))  # 0 + 0.5 * 3
    torch.testing.assert_close(first["bn.running_var"], torch.tensor([3.0]))  # statistics: plain average
    second = heavy.aggregate(2, first, states(1.5, 1.5), [], {}).global_state
    torch.testing.assert_close(second["w"], torch.tensor([1.5 + 0.5 * 0.9 * 3.0]))  # delta 0, velocity 2.7
    restarted = make_strategy(StrategySettings(strategy="fedavgm", server=ServerSettings(lr=0.5, momentum=0.9)),
                              current, 0)
    restarted.load_state_dict(heavy.state_dict())
    assert restarted.aggregate(3, second, states(0.0), [], {}).global_state["w"].item() == pytest.approx(
        heavy.aggregate(3, second, states(0.0), [], {}).global_state["w"].item())


def test_server_adam_follows_its_update_rule() -> None:
    current = {"w": torch.tensor([1.0])}
    adam = make_strategy(StrategySettings(strategy="fedadam", server=ServerSettings(lr=0.1, momentum=0.9, beta2=0.99,
                                                                                    tau=1e-3)), current, 0)
    delta = 2.0  # mean 3 - current 1
    m, v = 0.1 * delta, 0.01 * delta**2
    expected = 1.0 + 0.1 * m / (math.sqrt(v) + 1e-3)
    out = adam.aggregate(1, current, [ClientUpdate("a", {"w": torch.tensor([3.0])}, 1)], [], {}).global_state
    assert out["w"].item() == pytest.approx(expected, rel=1e-6)


def test_the_local_companion_is_the_local_only_baseline_and_is_served_where_it_validates_better(fleet) -> None:
    cfg = small_config("dlinear")
    training = HeadTraining(batch_size=16, lr=3e-3, keep_local=True, local_patience=2)
    learners = head_learners(fleet, cfg, training, seed=4)
    state = initial_shared_state(cfg, 4)
    for number in range(1, 4):
        state = weighted_mean(train_clients(learners, state, number))
    baseline = run_local_only(fleet, cfg, TrainingBudget(3, 2, 16, 3e-3, 4))
    for learner, client in zip(learners, fleet):
        assert evaluate(learner.alone.best_model(), client.test) == baseline.client_test[client.name]
    noise = {k: torch.randn_like(v) * 100 for k, v in state.items()}  # a federated model nobody should serve
    learners[0].load_global(noise)
    served = learners[0].serving_model(4)
    assert served.which == "local" and served.scores["local"] < served.scores["federated"]
    assert evaluate(served.model, fleet[0].test) == baseline.client_test[fleet[0].name]
    learners[0].load_global(state)
    restored = head_learners(fleet, cfg, training, seed=4)[0]
    restored.restore(learners[0].personal_state())
    assert restored.alone.best_val == learners[0].alone.best_val and restored.alone.epochs == 3


def test_a_gateway_that_joins_a_trained_fleet_fine_tunes_the_fleets_model_as_its_local_one(fleet) -> None:
    """From round 2 on, a companion that has not trained yet starts from the received global
    state (the local-only baseline with that ``start``); in round 1 it starts at random, as the
    baseline does, and once trained it is never reset by a later global state."""
    cfg = small_config("dlinear")
    training = HeadTraining(batch_size=16, lr=3e-3, keep_local=True, local_patience=2)
    fleet_state = {k: v + 0.5 for k, v in initial_shared_state(cfg, 4).items()}  # no random start equals it
    budget = TrainingBudget(1, 2, 16, 3e-3, 4)
    from_scratch = run_local_only(fleet[:1], cfg, budget).client_test[fleet[0].name]
    from_fleet = run_local_only(fleet[:1], cfg, budget, start=fleet_state).client_test[fleet[0].name]
    assert from_fleet != from_scratch
    for round_index, expected in ((1, from_scratch), (7, from_fleet)):
        learner = head_learners(fleet[:1], cfg, training, seed=4)[0]
        learner.load_global(fleet_state)
        learner.train(round_index)
        assert evaluate(learner.alone.best_model(), fleet[0].test) == expected
        before = {k: v.clone() for k, v in learner.alone.model.state_dict().items()}
        learner.alone.start_from(initial_shared_state(cfg, 4))
        assert all(torch.equal(before[k], v) for k, v in learner.alone.model.state_dict().items())


def test_a_federation_with_keep_local_reports_which_gateways_serve_their_local_model(fleet) -> None:
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=3, batch_size=16, lr=3e-3, seed=4, keep_local=True, test_every_round=False)
    result = run_federation(fleet, cfg, fed)
    plain = run_federation(fleet, cfg, fed.model_copy(update={"keep_local": False}))
    assert result.records[-1].val.mse <= plain.records[-1].val.mse  # per-client choice can only help on val
    assert all(set(r.serving_local) <= {c.name for c in fleet} for r in result.records)


def test_min_steps_gives_a_short_history_more_passes_and_the_companion_validates_each(fleet) -> None:
    training = HeadTraining(batch_size=16, lr=3e-3, min_steps=50)
    windows = len(fleet[0].train)
    per_epoch = math.ceil(windows / 16)
    assert training.epochs_over(windows) == math.ceil(50 / per_epoch) > 1
    assert training.epochs_over(16 * 50) == 1  # a long history keeps local_epochs
    assert HeadTraining(batch_size=16, local_epochs=3, min_steps=50).epochs_over(16 * 50) == 3
    cfg = small_config("dlinear")
    plain = run_local_only(fleet, cfg, TrainingBudget(2, 100, 16, 3e-3, 4))
    floored = run_local_only(fleet, cfg, TrainingBudget(2, 100, 16, 3e-3, 4, min_steps=50))
    assert all(e == 2 for e in plain.epochs.values())
    assert all(floored.epochs[c.name] == 2 * training.epochs_over(len(c.train)) for c in fleet)
    learner = head_learners(fleet, cfg, training.model_copy(update={"keep_local": True, "local_patience": 1}), seed=4)[0]
    learner.alone.step()  # one round: every epoch validated, patience 1 may stop it inside the round
    assert 1 <= learner.alone.epochs <= training.epochs_over(len(fleet[0].train))
    assert evaluate(learner.alone.best_model(), fleet[0].val).score == pytest.approx(learner.alone.best_val)


def test_max_steps_bounds_a_rounds_steps_however_long_the_history(fleet) -> None:
    """A round trains at most ``max_steps`` optimizer steps per model, drawn from a fresh shuffle
    of every window, so its cost does not grow with the history; unbounded, it makes a whole epoch."""
    from edge_agent.train import make_optimizer, seeded_steps

    client = fleet[0]
    per_epoch = math.ceil(len(client.train) / 16)
    model = client_model(small_config("dlinear"), client.n_features, 4, 0)

    def count(max_steps: int) -> int:
        return len(seeded_steps(make_optimizer(model, 1e-3), len(client.train), 1, 16, 0,
                                lambda batch, epoch, step: forecast_loss(model, *client.train.batch(batch)),
                                max_steps))

    assert per_epoch > 3 and count(0) == per_epoch and count(3) == 3
    learner = head_learners([client], small_config("dlinear"),
                            HeadTraining(batch_size=16, max_steps=3, keep_local=True), seed=4)[0]
    learner.train(1)
    assert learner.alone.epochs == 1  # the companion's round: one (partial) epoch, validated
