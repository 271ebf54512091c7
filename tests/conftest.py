"""Shared fixtures: small model configs that keep the suite fast on two cores."""

from __future__ import annotations

import pytest
import torch

from edge_agent.models import ModelConfig

torch.set_num_threads(2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files whose tests start a broker first, each file whole and in its own order: with
    `make test`'s two workers (a file each at a time) the long service files, which mostly wait,
    spread over both, and the quick unit files fill the end instead of one worker finishing a
    service file alone."""
    brokered = {item.path for item in items if "mosquitto" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.path not in brokered)


def small_config(backbone: str, **overrides: object) -> ModelConfig:
    """A scaled-down model (same structure as the paper's, smaller widths)."""
    sizes = dict(lookback=24, horizon=12, d_qap=16, qap_heads=2, hidden=16, d_ff=32, heads=4)
    sizes.update(overrides)
    return ModelConfig.paper(backbone=backbone, **sizes)


def trained(backbone: str, data, steps: int = 25, **overrides: object) -> torch.nn.Module:
    """A small model after ``steps`` real training steps, so BatchNorm running statistics (which
    eval mode uses), weights and firing rates are not those of initialisation."""
    from edge_agent.models import build_forecaster
    from edge_agent.train import forecast_loss

    model = build_forecaster(small_config(backbone, **overrides), data.n_features, 4, seed=3)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = list(data.train.batches(64, shuffle=False))
    torch.manual_seed(0)  # dropout draws from the global generator
    for step in range(steps):
        x, marks, y = batches[step % len(batches)]
        optimizer.zero_grad()
        forecast_loss(model, x, marks, y).backward()
        optimizer.step()
    return model.eval()


def calibrated(backbone: str, data) -> torch.nn.Module:
    """A small untrained model whose BatchNorm statistics come from ``data``'s training windows:
    spiking layers then fire (about 15%) without the cost of training, enough to count operations."""
    from edge_agent.models import build_forecaster
    from edge_agent.train import calibrate_batchnorm

    with torch.no_grad():
        return calibrate_batchnorm(build_forecaster(small_config(backbone), data.n_features, 4, seed=3), data.train)


@pytest.fixture
def make_config():
    return small_config


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Service processes a test started do not outlive it, whether it passed or failed."""
    yield
    from tests.fleet import stop_started

    stop_started()


@pytest.fixture
def mosquitto(tmp_path):
    """A fresh broker for one test."""
    from tests.broker import Mosquitto

    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL database for one test (skipped where no server runs)."""
    from tests.postgres import fresh_database

    with fresh_database() as url:
        yield url


def train_clients(learners, state, round_number: int, indices=None) -> list:
    """What the chosen learners (default all) upload for ``round_number`` after installing
    ``state``: the updates the round engine would receive, built by hand."""
    from coordinator.strategies import ClientUpdate

    updates = []
    for i in range(len(learners)) if indices is None else indices:
        learners[i].load_global(state)
        loss = learners[i].train(round_number)
        updates.append(ClientUpdate(f"client{i}", learners[i].wire_state(round_number), learners[i].n_samples,
                                    {"loss": loss}))
    return updates
