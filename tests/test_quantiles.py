"""Quantile forecasts in head mode: config validation, non-crossing quantiles for every backbone on
real data, point mode left as it was, and a short federation trained with the pinball loss."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from edge_agent.data import TIME_FEATURES, load_site, prepare_client
from edge_agent.models import BACKBONES, build_forecaster, load_checkpoint, save_checkpoint
from edge_agent.models.heads import monotone_quantiles
from edge_agent.train import evaluate
from tests.conftest import small_config, trained

LEVELS = (0.1, 0.5, 0.9)


@pytest.fixture(scope="module")
def miami():
    return prepare_client(load_site("miami"), 24, 12, stride=24)


@pytest.mark.parametrize(("levels", "reason"), [
    ((0.1, 0.9), "must include 0.5"),
    ((0.5, 0.1), "strictly increasing"),
    ((0.5, 0.5), "strictly increasing"),
    ((0.0, 0.5), "strictly between 0 and 1"),
    ((0.5, 1.0), "strictly between 0 and 1"),
])
def test_invalid_levels_are_refused_naming_the_field(levels: tuple[float, ...], reason: str) -> None:
    with pytest.raises(ValidationError, match=rf"quantiles\n.*{reason}"):
        small_config("dlinear", quantiles=levels)


def test_monotone_parameterization_never_crosses_and_keeps_the_median() -> None:
    raw = torch.tensor([[5.0, -3.0, -50.0, 40.0, -200.0]])
    q = monotone_quantiles(raw, median=1)
    assert (q.diff(dim=-1) >= 0).all()
    assert q[0, 1] == -3.0  # the median is the raw output itself
    # below: q0 = -3 - softplus(5); above: q2 = -3 + softplus(-50), q3 = q2 + softplus(40), ...
    assert q[0, 0].item() == pytest.approx(-3.0 - torch.nn.functional.softplus(torch.tensor(5.0)).item())
    assert q[0, 3].item() == pytest.approx(-3.0 + 40.0, abs=1e-4)


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_quantiles_do_not_cross_for_every_backbone_on_real_data(backbone: str, miami) -> None:
    model = trained(backbone, miami, steps=10, quantiles=LEVELS)
    x, marks, y = miami.test.batch(torch.arange(32))
    with torch.no_grad():
        q = model.forward_quantiles(x, marks)
        point = model(x, marks)
    assert q.shape == (32, 12, miami.n_features, 3) and torch.isfinite(q).all()
    assert (q.diff(dim=-1) >= 0).all(), "quantiles cross"
    torch.testing.assert_close(point, q[..., 1])  # the point forecast is the median
    metrics = evaluate(model, miami.test)
    assert 0.0 <= metrics.icp <= 1.0 and metrics.mil >= 0.0 and metrics.qs > 0.0


def test_point_models_are_unchanged_by_the_option() -> None:
    point = build_forecaster(small_config("dlinear"), 3, TIME_FEATURES, seed=0)
    quantile = build_forecaster(small_config("dlinear", quantiles=LEVELS), 3, TIME_FEATURES, seed=0)
    assert point.levels is None and point.shared_state().keys() == quantile.shared_state().keys()
    assert point.state_dict()["personal.head.channels.weight"].shape == (3, 16)
    assert quantile.state_dict()["personal.head.channels.weight"].shape == (9, 16)
    with pytest.raises(ValueError, match="no quantiles"):
        point.forward_quantiles(torch.zeros(1, 24, 3), torch.zeros(1, 24, TIME_FEATURES))


def test_a_checkpoint_keeps_the_levels_and_the_quantiles(tmp_path) -> None:
    model = build_forecaster(small_config("lstm", quantiles=(0.05, 0.5, 0.95)), 2, TIME_FEATURES, seed=1).eval()
    save_checkpoint(model, tmp_path / "q.safetensors")
    loaded, _ = load_checkpoint(tmp_path / "q.safetensors")
    x, marks = torch.randn(2, 24, 2), torch.zeros(2, 24, TIME_FEATURES)
    assert loaded.levels == (0.05, 0.5, 0.95)
    torch.testing.assert_close(loaded.eval().forward_quantiles(x, marks), model.forward_quantiles(x, marks))


def test_head_mode_federation_trains_with_pinball_loss_and_reports_coverage() -> None:
    clients = [prepare_client(load_site(site), 24, 12, stride=12) for site in ("miami", "amsterdam")]
    cfg = small_config("dlinear", quantiles=LEVELS)
    result = run_federation(clients, cfg, FederationConfig(rounds=3, batch_size=64, lr=3e-3, seed=5))
    losses = [r.train_loss for r in result.records]
    assert losses[-1] < losses[0], losses
    for record in result.records:
        assert 0.0 < record.val.icp <= 1.0 and record.val.mil > 0.0 and record.val.qs > 0.0
    assert all(m.icp is not None for m in result.client_test.values())
    assert all(m.icp_conformal is not None and m.mil_conformal > 0.0 for m in result.client_test.values())
    assert result.test.qs == pytest.approx(
        sum(m.qs * c.n_train for m, c in zip(result.client_test.values(), clients)) / sum(c.n_train for c in clients))
