"""Split-conformal calibration of quantile intervals (CQR, Romano et al. 2019): offsets by hand,
the finite-sample coverage guarantee on a seeded sample, non-crossing under narrowing, and the
calibrated ICP and MIL that ``evaluate`` reports for a quantile model trained on real data."""

from __future__ import annotations

import pytest
import torch

from edge_agent.conformal import apply_offsets, conformity_scores, fit_offsets
from edge_agent.data import load_site, prepare_client
from edge_agent.metrics import covered, interval_coverage
from edge_agent.train import Metrics, conformal_offsets, evaluate, weighted_metrics
from tests.conftest import trained

LEVELS = (0.1, 0.5, 0.9)  # nominal coverage 0.9 - 0.1 = 0.8


def intervals(lower: torch.Tensor, upper: torch.Tensor) -> torch.Tensor:
    """(N, H, F, 3) forecasts from bounds, the median halfway between them."""
    return torch.stack([lower, (lower + upper) / 2, upper], dim=-1)


def test_scores_by_hand() -> None:
    # E = max(q_lo - y, y - q_hi) on the interval [0, 1]:
    # y = 0.5 -> max(-0.5, -0.5) = -0.5 (inside); y = 1.5 -> max(-1.5, 0.5) = 0.5; y = -0.2 -> max(0.2, -1.2) = 0.2
    forecast = intervals(torch.zeros(3), torch.ones(3))
    scores = conformity_scores(forecast, torch.tensor([0.5, 1.5, -0.2]))
    torch.testing.assert_close(scores, torch.tensor([-0.5, 0.5, 0.2]))


def test_offsets_by_hand_per_step_and_feature() -> None:
    # n = 9 windows, H = 1, F = 2. Feature 0: interval [0, 0], so E = |y|; the |y| sorted are
    # 0.1, 0.2, ..., 0.9 and the rank is ceil(0.8 * (9 + 1)) = 8, so the offset is 0.8.
    # Feature 1: interval [-1, 1] around the same targets, so E = |y| - 1 and the offset 0.8 - 1 = -0.2.
    y = torch.tensor([0.3, -0.1, 0.9, -0.5, 0.2, 0.7, -0.8, 0.4, 0.6])
    target = torch.stack([y, y], dim=-1).unsqueeze(1)  # (9, 1, 2)
    lower = torch.stack([torch.zeros(9), -torch.ones(9)], dim=-1).unsqueeze(1)
    offsets = fit_offsets(intervals(lower, -lower), target, LEVELS)
    torch.testing.assert_close(offsets, torch.tensor([[0.8, -0.2]]))


def test_too_few_windows_are_refused_naming_the_reason() -> None:
    # n = 3: ceil(0.8 * 4) = 4 > 3, the offset would be infinite
    forecast = intervals(torch.zeros(3, 1, 1), torch.ones(3, 1, 1))
    with pytest.raises(ValueError, match="3 calibration windows are too few"):
        fit_offsets(forecast, torch.zeros(3, 1, 1), LEVELS)


def test_calibration_reaches_nominal_coverage_where_raw_intervals_are_too_narrow() -> None:
    # CQR theorem 1: over the draw of n exchangeable calibration scores and a fresh one, coverage is
    # in [0.8, 0.8 + 1/(n + 1)]; for continuous scores it is exactly rank/(n + 1) = ceil(0.8 * 21)/21
    # = 17/21 = 0.8095 with n = 20. 1000 independent repetitions sit on the H axis (offsets are per
    # step), each checked on 200 fresh targets. y ~ N(0, sigma_f^2) with sigma = 1 and 5: the raw
    # interval [-0.5, 0.5] covers ~38% and ~8%.
    generator = torch.Generator().manual_seed(0)
    scale = torch.tensor([1.0, 5.0])
    calibration, fresh = (torch.randn(n, 1000, 2, generator=generator) * scale for n in (20, 200))

    def raw(n: int) -> torch.Tensor:
        return intervals(torch.full((n, 1000, 2), -0.5), torch.full((n, 1000, 2), 0.5))

    offsets = fit_offsets(raw(20), calibration, LEVELS)
    per_feature = covered(apply_offsets(raw(200), offsets), fresh).mean(dim=(0, 1))
    assert interval_coverage(raw(200), fresh) < 0.5
    torch.testing.assert_close(per_feature, torch.full((2,), 17 / 21), atol=0.01, rtol=0.0)


def test_negative_offsets_keep_quantiles_non_crossing_and_the_median() -> None:
    forecast = intervals(-torch.rand(50, 3, 2), torch.rand(50, 3, 2))
    narrowed = apply_offsets(forecast, torch.full((3, 2), -0.7))
    assert (narrowed.diff(dim=-1) >= 0).all(), "quantiles cross"
    torch.testing.assert_close(narrowed[..., 1], forecast[..., 1])
    # the lower bound is at most the median: moved up by 0.7 where it was more than 0.7 below, else clamped
    torch.testing.assert_close(narrowed[..., 0], torch.minimum(forecast[..., 0] + 0.7, forecast[..., 1]))


def test_evaluate_reports_calibrated_coverage_on_real_data() -> None:
    miami = prepare_client(load_site("miami"), 24, 12, stride=24)
    model = trained("dlinear", miami, steps=10, quantiles=LEVELS)
    offsets = conformal_offsets(model, miami.val)
    assert offsets.shape == (12, miami.n_features)
    plain, calibrated = evaluate(model, miami.test), evaluate(model, miami.test, offsets=offsets)
    assert plain.icp_conformal is None and plain.mil_conformal is None
    unchanged = ("mse", "mae", "qs", "icp", "mil")
    assert [getattr(plain, n) for n in unchanged] == [getattr(calibrated, n) for n in unchanged]
    assert 0.0 <= calibrated.icp_conformal <= 1.0 and calibrated.mil_conformal >= 0.0
    # on the calibration windows themselves at least ceil(0.8 (n + 1)) of n scores are <= the offset
    assert evaluate(model, miami.val, offsets=offsets).icp_conformal >= 0.8


def test_point_models_refuse_offsets() -> None:
    miami = prepare_client(load_site("miami"), 24, 12, stride=24)
    model = trained("dlinear", miami, steps=1)
    with pytest.raises(ValueError, match="point model"):
        evaluate(model, miami.test, offsets=torch.zeros(12, miami.n_features))


def test_fleet_means_carry_the_calibrated_numbers_only_where_every_gateway_has_them() -> None:
    # weights 1/4 and 3/4: icp_conformal 0.25 * 0.6 + 0.75 * 0.8 = 0.75, mil_conformal 0.25 * 2 + 0.75 * 4 = 3.5
    a, b = Metrics(1.0, 1.0, 0.5, 0.7, 1.0, 0.6, 2.0), Metrics(2.0, 1.0, 0.5, 0.7, 1.0, 0.8, 4.0)
    fleet = weighted_metrics([a, b], [1, 3])
    assert (fleet.icp_conformal, fleet.mil_conformal) == pytest.approx((0.75, 3.5))
    assert fleet.mse == pytest.approx(1.75) and fleet.icp == pytest.approx(0.7)
    raw = weighted_metrics([a, Metrics(2.0, 1.0, 0.5, 0.7, 1.0)], [1, 3])
    assert raw.icp == pytest.approx(0.7) and raw.icp_conformal is None
    assert weighted_metrics([Metrics(1.0, 2.0), Metrics(3.0, 4.0)], [1, 1]) == Metrics(2.0, 3.0)
