"""FedPoD rounds in one process: graphs trained on the server, different prompts per client, the
Table 1 baselines through the same engine."""

from __future__ import annotations

import pytest
import torch

from coordinator.simulation.pretrain import pretrain
from coordinator.simulation.pretrain_config import PretrainConfig
from coordinator.simulation.prompts import PromptFederationConfig, evaluate_prompt_fleet, run_prompt_federation
from coordinator.strategies import ClientInfo, ClientUpdate, make_strategy
from coordinator.strategy_settings import GraphSettings
from coordinator.strategies.prompt_graph import DynamicGraphs, geo_graph, views_from_states
from edge_agent.data import load_site, load_sites
from edge_agent.data.canonical import device_series
from edge_agent.learners.prompt import initial_prompt_state
from edge_agent.models.foundation import content_hash
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.models.prompt_settings import PromptConfig

FM = FoundationConfig(window=24, d_model=32, heads=2, layers=1, d_ff=64, dropout=0.1)
SITES = ("amsterdam", "miami", "greensboro", "burlington")
FAST = dict(rounds=2, batch_size=64, stride=12, fedpod=GraphSettings(graph_epochs=10))


@pytest.fixture(scope="module")
def fleet():
    devices = [device_series(t, FM.variables, FM.window, stride=24) for t in load_sites()]
    foundation, _ = pretrain(devices, FM, PretrainConfig(rounds=2, participation=1.0, batch_size=32, lr=3e-3, stride=24))
    return foundation, [load_site(s) for s in SITES]


def test_rounds_personalize_prompts_per_client_and_keep_the_foundation(fleet) -> None:
    foundation, tables = fleet
    before = content_hash(foundation)
    learners, records = run_prompt_federation(tables, foundation, PromptConfig(), PromptFederationConfig(**FAST))
    assert [r.round for r in records] == [1, 2] and all(r.rmse > 0 and "graph_loss" in r.metrics for r in records)
    assert all(r.val.mse > 0 and r.val.qs is None and r.test is None for r in records)  # point: no QS, no test
    personal = [lr.references["personalized"] for lr in learners]
    assert all(not torch.equal(personal[0], p) for p in personal[1:])  # each client its own prompts
    assert all(len(lr.references["neighbours"]) == 1 for lr in learners)  # N / S_G - 1 = 4 / 2 - 1
    assert all(torch.equal(lr.references["global_prompts"], learners[0].references["global_prompts"])
               for lr in learners)
    assert all(torch.equal(lr.model.prompt_vector(), p) for lr, p in zip(learners, personal))
    assert content_hash(foundation) == before
    again, repeated = run_prompt_federation(tables, foundation, PromptConfig(), PromptFederationConfig(**FAST))
    assert [(r.mae, r.rmse) for r in repeated] == [(r.mae, r.rmse) for r in records]  # same seeds, same numbers


def test_a_quantile_fleet_reports_qs_icp_mil_and_conformal_intervals(fleet) -> None:
    foundation, tables = fleet
    cfg = PromptFederationConfig(**{**FAST, "rounds": 1, "test_every_round": True})
    learners, records = run_prompt_federation(tables, foundation, PromptConfig(quantiles=(0.1, 0.5, 0.9)), cfg)
    val, test = records[0].val, records[0].test
    assert val.qs > 0 and 0 < val.icp <= 1 and val.mil > 0 and val.icp_conformal is None
    assert test.qs > 0 and 0 < test.icp <= 1 and 0 < test.icp_conformal <= 1 and test.mil_conformal > 0
    fleet_test, per_client = evaluate_prompt_fleet(learners)
    assert fleet_test == test and set(per_client) == {t.name for t in tables}
    assert all(m.icp_conformal is not None for m in per_client.values())


def test_the_prompts_fedavg_baseline_gives_every_client_the_same_prompts_and_no_targets(fleet) -> None:
    foundation, tables = fleet
    cfg = PromptFederationConfig(**{**FAST, "rounds": 1, "strategy": "fedavg"})
    learners, _ = run_prompt_federation(tables, foundation, PromptConfig(), cfg)
    assert all(lr.references == {} for lr in learners)
    assert all(torch.equal(learners[0].model.prompt_vector(), lr.model.prompt_vector()) for lr in learners[1:])


def test_fine_tuning_baselines_send_the_foundation_and_freeze_the_prompts(fleet) -> None:
    foundation, tables = fleet
    cfg = PromptFederationConfig(**{**FAST, "rounds": 1, "strategy": "fedavg"})
    learners, _ = run_prompt_federation(tables, foundation, PromptConfig(), cfg, tune_foundation=True)
    sent = learners[0].wire_state(1)
    assert any(k.startswith("foundation.") for k in sent) and not any(k.startswith("prompts.") for k in sent)
    assert content_hash(learners[0].model.foundation) != content_hash(foundation)  # trained, on a copy
    assert all(torch.equal(learners[0].wire_state(1)[k], lr.wire_state(1)[k]) for lr in learners[1:] for k in sent)


def test_graph_training_lowers_its_objective(fleet) -> None:
    foundation, tables = fleet
    states = [initial_prompt_state(foundation, PromptConfig(), seed) for seed in range(4)]
    views = views_from_states(states)
    coordinates = torch.tensor([[t.latitude, t.longitude] for t in tables])
    graphs = DynamicGraphs({name: view.shape[1] for name, view in views.items()}, seed=0)
    losses = graphs.fit(views, geo_graph(coordinates.float()), epochs=40, lr=0.05, sparsity=1.0)
    assert losses[-1] < losses[0]
    a, fused = graphs.matrices(views, geo_graph(coordinates.float()))
    torch.testing.assert_close(fused.sum(1), torch.ones(len(tables)))


def test_the_fedpod_strategy_sends_each_on_time_client_its_references_and_keeps_its_graphs(fleet) -> None:
    foundation, tables = fleet
    initial = initial_prompt_state(foundation, PromptConfig(), 0)
    strategy = make_strategy(PromptFederationConfig(fedpod=GraphSettings(graph_epochs=3)), initial, seed=1)
    roster = {t.name: ClientInfo(t.name, 10 * (i + 1), t.latitude, t.longitude) for i, t in enumerate(tables)}
    updates = [ClientUpdate(t.name, initial_prompt_state(foundation, PromptConfig(), i + 5), 10 * (i + 1))
               for i, t in enumerate(tables)]
    result = strategy.aggregate(1, initial, updates[:3], updates[3:], roster)
    assert set(result.personal) == {t.name for t in tables[:3]}  # imputed clients get no message
    size = sum(v.numel() for k, v in initial.items() if k.startswith("prompts."))
    for message in result.personal.values():
        assert message["personalized"].shape == (size,) and message["neighbours"].shape == (1, size)
    restarted = make_strategy(PromptFederationConfig(), initial, seed=2)
    restarted.load_state_dict(strategy.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(strategy.graphs.parameters(), restarted.graphs.parameters()))
