"""Fourier-magnitude noise on core-sets (FeDaL): phases kept, magnitudes changed, reproducible."""

from __future__ import annotations

import math

import pytest
import torch

from edge_agent.data import load_site
from edge_agent.privacy import fourier_magnitude_noise


def windows() -> torch.Tensor:
    """Four real 48-hour windows of the Amsterdam station, (4, 48, V)."""
    values = torch.tensor(load_site("amsterdam").values[:192]).reshape(4, 48, -1)
    return (values - values.mean(dim=(0, 1))) / values.std(dim=(0, 1)).clamp_min(1e-6)


def test_the_noise_changes_the_magnitudes_and_keeps_every_phase() -> None:
    clean = windows()
    noisy = fourier_magnitude_noise(clean, 0.5, torch.Generator().manual_seed(1))
    assert noisy.shape == clean.shape and noisy.dtype == clean.dtype
    before, after = torch.fft.rfft(clean.double(), dim=1), torch.fft.rfft(noisy.double(), dim=1)
    strong = before.abs() > 1e-3 * before.abs().max()
    turned = torch.remainder(after.angle() - before.angle() + math.pi, 2 * math.pi) - math.pi
    assert turned[strong].abs().max() < 1e-4
    change = (after.abs()[strong] / before.abs()[strong]).log()
    assert change.std() == pytest.approx(0.5, rel=0.15)
    assert not torch.allclose(noisy, clean, atol=1e-2)


def test_no_noise_is_the_identity_and_a_seed_gives_the_same_noise() -> None:
    clean = windows()
    torch.testing.assert_close(fourier_magnitude_noise(clean, 0.0, torch.Generator()), clean)
    first = fourier_magnitude_noise(clean, 0.3, torch.Generator().manual_seed(7))
    torch.testing.assert_close(first, fourier_magnitude_noise(clean, 0.3, torch.Generator().manual_seed(7)))
    assert not torch.equal(first, fourier_magnitude_noise(clean, 0.3, torch.Generator().manual_seed(8)))
    with pytest.raises(ValueError, match="sigma"):
        fourier_magnitude_noise(clean, -1.0, torch.Generator())
