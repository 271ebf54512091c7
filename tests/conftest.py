"""Shared fixtures: small model configs that keep the suite fast on two cores."""

from __future__ import annotations

import pytest
import torch

from edge_agent.models import ModelConfig

torch.set_num_threads(2)


def small_config(backbone: str, **overrides: object) -> ModelConfig:
    """A scaled-down model (same structure as the paper's, smaller widths)."""
    sizes = dict(lookback=24, horizon=12, d_qap=16, qap_heads=2, hidden=16, d_ff=32, heads=4)
    sizes.update(overrides)
    return ModelConfig(backbone=backbone, **sizes)


@pytest.fixture
def make_config():
    return small_config


@pytest.fixture
def mosquitto(tmp_path):
    """A fresh broker for one test."""
    from tests.broker import Mosquitto

    broker = Mosquitto(tmp_path / "broker").start()
    yield broker
    broker.stop()
