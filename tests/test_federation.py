"""In-process federation, aggregation and baselines on small real and synthetic fleets."""

from __future__ import annotations

import pytest
import torch

from coordinator.simulation.baselines import TrainingBudget, run_centralized, run_local_only
from coordinator.simulation.federation import head_learners, run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.strategies import ClientUpdate, weighted_mean
from coordinator.strategy_settings import STRATEGIES, StrategySettings
from edge_agent.data import prepare_client, synthetic_clients
from edge_agent.learners.head import initial_shared_state
from tests.conftest import small_config, train_clients


@pytest.fixture(scope="module")
def fleet():
    tables = synthetic_clients(n_clients=3, n_features=4, n_steps=500, seed=11)
    subsets = [[0], [0, 1, 2], [1, 2, 3]]
    return [prepare_client(t.select([t.columns[i] for i in s]), 24, 12, stride=4) for t, s in zip(tables, subsets)]


def test_fedavg_is_the_sample_weighted_mean() -> None:
    updates = [
        ClientUpdate("a", {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(0.0)}, 1),
        ClientUpdate("b", {"w": torch.tensor([4.0, 8.0]), "b": torch.tensor(3.0)}, 3),
    ]
    out = weighted_mean(updates)
    torch.testing.assert_close(out["w"], torch.tensor([3.25, 6.5]))
    torch.testing.assert_close(out["b"], torch.tensor(2.25))
    assert out["w"].dtype == torch.float32


def test_fedavg_rejects_empty_round_and_unknown_strategy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="at least one"):
        weighted_mean([])
    with pytest.raises(ValueError, match=str(sorted(STRATEGIES))[1:-1]):
        StrategySettings(strategy="fedprox-typo")


def test_one_round_aggregates_exactly_the_clients_shared_parts(fleet) -> None:
    cfg = small_config("dlinear")
    fed = FederationConfig(rounds=1, batch_size=32, seed=3)
    initial = initial_shared_state(cfg, fed.seed)
    updates = train_clients(head_learners(fleet, cfg, fed, fed.seed), initial, 1)
    assert all(u.metrics["loss"] > 0 for u in updates) and len(updates) == 3
    assert [u.n_samples for u in updates] == [c.n_train for c in fleet]
    for update in updates:
        assert update.params.keys() == initial.keys()
        assert all(name.startswith("shared.") for name in update.params)
        assert any(not torch.equal(update.params[k], initial[k]) for k in initial)
    merged = weighted_mean(updates)
    total = sum(u.n_samples for u in updates)
    name = "shared.backbone.seasonal.weight"
    expected = sum(u.params[name].double() * u.n_samples / total for u in updates).float()
    torch.testing.assert_close(merged[name], expected)


def test_federation_is_deterministic_and_personal_heads_stay_local(fleet) -> None:
    cfg = small_config("spikernn")
    fed = FederationConfig(rounds=2, batch_size=32, seed=5)
    first, second = run_federation(fleet, cfg, fed), run_federation(fleet, cfg, fed)
    assert [r.val for r in first.records] == [r.val for r in second.records]
    assert all(torch.equal(first.shared[k], second.shared[k]) for k in first.shared)
    assert not any("personal" in k for k in first.shared)
    other = run_federation(fleet, cfg, fed.model_copy(update={"seed": 6}))
    assert other.records[-1].val != first.records[-1].val
    assert len(first.records) == 2 and 1 <= first.best_round <= 2
    assert set(first.client_test) == {c.name for c in fleet}


def test_federation_learns_on_synthetic_seasonal_data(fleet) -> None:
    cfg = small_config("dlinear", dropout=0.0)
    result = run_federation(fleet, cfg, FederationConfig(rounds=10, batch_size=16, lr=3e-3, seed=1))
    losses = [r.train_loss for r in result.records]
    assert losses[-1] < 0.7 * losses[0]
    assert result.best_round > 1
    assert result.test.mse < 0.75 * result.records[0].test.mse


def test_reported_test_metrics_are_those_of_the_best_validation_round(fleet) -> None:
    cfg = small_config("dlinear")
    every = run_federation(fleet, cfg, FederationConfig(rounds=4, batch_size=32, lr=1e-2))
    best = min(every.records, key=lambda r: r.val.mse)
    assert every.best_round == best.round and every.test == best.test
    lean = run_federation(fleet, cfg, FederationConfig(rounds=4, batch_size=32, lr=1e-2, test_every_round=False))
    assert all(r.test is None for r in lean.records)
    assert lean.test == every.test and lean.best_round == every.best_round


def test_local_only_and_centralized_baselines_run_and_early_stop(fleet) -> None:
    cfg = small_config("dlinear")
    local = run_local_only(fleet, cfg, TrainingBudget(30, 2, 32, 1e-2, 0))
    assert set(local.epochs) == {c.name for c in fleet}
    assert all(1 <= e <= 30 for e in local.epochs.values())
    assert local.test.mse > 0
    central = run_centralized(fleet, cfg, TrainingBudget(2, 1, 32, 1e-3, 0))
    assert central.test.mse > 0 and set(central.client_test) == set(local.client_test)
    again = run_centralized(fleet, cfg, TrainingBudget(2, 1, 32, 1e-3, 0))
    assert again.test == central.test
