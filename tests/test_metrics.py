"""Fed-GAME's quantile metrics (section 3, Table 1) against values computed by hand."""

from __future__ import annotations

import pytest
import torch

from edge_agent.metrics import interval_coverage, mean_interval_length, pinball_loss, pinball_terms, quantile_score

LEVELS = (0.1, 0.5, 0.9)
# two targets, three quantiles each
FORECAST = torch.tensor([[0.0, 1.0, 2.0], [2.0, 3.0, 3.5]])
TARGET = torch.tensor([1.0, 4.0])


def test_pinball_terms_by_hand() -> None:
    # u = y - q; rho_tau(u) = max(tau u, (tau - 1) u)
    # target 1: u = (1, 0, -1)   -> (0.1*1, 0, -0.1*-1)   = (0.1, 0.0, 0.1)
    # target 4: u = (2, 1, 0.5)  -> (0.1*2, 0.5*1, 0.9*0.5) = (0.2, 0.5, 0.45)
    expected = torch.tensor([[0.1, 0.0, 0.1], [0.2, 0.5, 0.45]])
    assert torch.allclose(pinball_terms(FORECAST, TARGET, LEVELS), expected)


def test_quantile_score_is_the_mean_pinball_loss() -> None:
    # (0.1 + 0 + 0.1 + 0.2 + 0.5 + 0.45) / 6 = 1.35 / 6 = 0.225
    assert quantile_score(FORECAST, TARGET, LEVELS) == pytest.approx(0.225)
    assert pinball_loss(FORECAST, TARGET, LEVELS).item() == pytest.approx(0.225)


def test_median_pinball_is_half_the_absolute_error() -> None:
    # rho_0.5(u) = |u| / 2: |1 - 3| / 2 = 1
    assert pinball_loss(torch.tensor([[3.0]]), torch.tensor([1.0]), (0.5,)).item() == pytest.approx(1.0)


def test_interval_coverage_by_hand() -> None:
    # target 1 in [0, 2]: yes; target 4 in [2, 3.5]: no -> 1/2
    assert interval_coverage(FORECAST, TARGET) == pytest.approx(0.5)
    # bounds count as inside: targets exactly on the lowest and on the highest quantile
    assert interval_coverage(FORECAST, torch.tensor([0.0, 3.5])) == pytest.approx(1.0)


def test_mean_interval_length_by_hand() -> None:
    # widths 2 - 0 = 2 and 3.5 - 2 = 1.5 -> mean 1.75
    assert mean_interval_length(FORECAST) == pytest.approx(1.75)


def test_levels_must_match_the_quantile_axis() -> None:
    with pytest.raises(ValueError, match="3 quantiles .* levels name 2"):
        pinball_loss(FORECAST, TARGET, (0.1, 0.9))
