"""FedPoD rounds in one process: graphs trained on the server, different prompts per client."""

from __future__ import annotations

import pytest
import torch

from coordinator.fedpod import Client, DynamicGraphs, FedPodConfig, prompt_views, run_fedpod
from coordinator.pretrain import PretrainConfig, pretrain
from coordinator.prompt_graph import geo_graph
from edge_agent.data import load_site, load_sites
from edge_agent.data.canonical import device_series
from edge_agent.models.foundation import FoundationConfig, content_hash
from edge_agent.models.prompts import PromptConfig, PromptedForecaster, PromptLoss

FM = FoundationConfig(window=24, d_model=32, heads=2, layers=1, d_ff=64, dropout=0.1)
SITES = ("amsterdam", "miami", "greensboro", "burlington")


@pytest.fixture(scope="module")
def fleet():
    devices = [device_series(t, FM.variables, FM.window, stride=24) for t in load_sites()]
    foundation, _ = pretrain(devices, FM, PretrainConfig(rounds=2, participation=1.0, batch_size=32, lr=3e-3, stride=24))
    tables = [load_site(s) for s in SITES]
    clients = [
        Client(PromptedForecaster(foundation, PromptConfig(), t.latitude, t.longitude), PromptLoss(),
               device_series(t, FM.variables, FM.window, stride=12), {})
        for t in tables
    ]
    return foundation, clients, torch.tensor([[t.latitude, t.longitude] for t in tables])


def test_rounds_personalize_prompts_per_client_and_keep_the_foundation(fleet) -> None:
    foundation, clients, coordinates = fleet
    before = content_hash(foundation)
    records = run_fedpod(clients, coordinates, FedPodConfig(rounds=2, batch_size=64, graph_epochs=10))
    assert [r["round"] for r in records] == [1, 2] and all(r["rmse"] > 0 for r in records)
    personal = [c.references["personalized"] for c in clients]
    assert all(not torch.equal(personal[0], p) for p in personal[1:])  # each client its own prompts
    assert all(len(c.references["neighbours"]) == 1 for c in clients)  # N / S_G - 1 = 4 / 2 - 1
    assert all(torch.equal(c.references["global_prompts"], clients[0].references["global_prompts"]) for c in clients)
    assert content_hash(foundation) == before


def test_graph_training_lowers_its_objective(fleet) -> None:
    _, clients, coordinates = fleet
    views = prompt_views(clients)
    graphs = DynamicGraphs({name: view.shape[1] for name, view in views.items()}, seed=0)
    losses = graphs.fit(views, geo_graph(coordinates.float()), FedPodConfig(graph_epochs=40, graph_lr=0.05))
    assert losses[-1] < losses[0]
    a, fused = graphs.matrices(views, geo_graph(coordinates.float()))
    torch.testing.assert_close(fused.sum(1), torch.ones(len(clients)))


def test_privacy_noise_has_the_configured_scale_and_is_consistent_across_views(fleet) -> None:
    from coordinator.fedpod import with_privacy_noise

    _, clients, _ = fleet
    clean = prompt_views(clients)
    noisy = with_privacy_noise(clean, sigma=0.5, seed=3)
    noise = noisy["all"] - clean["all"]
    assert noise.std().item() == pytest.approx(0.5, rel=0.1)
    n_tv = clean["tv"].shape[1]
    torch.testing.assert_close(noisy["tv"] - clean["tv"], noise[:, :n_tv])
    torch.testing.assert_close(noisy["spatial"] - clean["spatial"], noise[:, n_tv:])
    assert with_privacy_noise(clean, sigma=0.0, seed=3) is clean


def test_the_fedavg_baseline_gives_every_client_the_same_sent_tensors(fleet) -> None:
    from coordinator.fedpod import run_fedavg, sent_state

    _, clients, _ = fleet
    run_fedavg(clients, FedPodConfig(rounds=1, batch_size=128))
    states = [sent_state(c.model) for c in clients]
    assert "prompts.temporal" in states[0] and not any(k.startswith(("foundation.", "weights.")) for k in states[0])
    assert all(torch.equal(states[0][k], s[k]) for s in states[1:] for k in states[0])


def test_graph_parameters_round_trip(fleet) -> None:
    _, clients, _ = fleet
    sizes = {name: view.shape[1] for name, view in prompt_views(clients).items()}
    trained, fresh = DynamicGraphs(sizes, seed=1), DynamicGraphs(sizes, seed=2)
    fresh.load_state_dict(trained.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(trained.parameters(), fresh.parameters()))
