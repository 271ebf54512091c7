"""Noise on what a client shares beyond model parameters (FeDaL's core-sets).

FeDaL (Method, Global Bias Elimination, core-set tuning) perturbs a core-set before upload in the
Fourier domain, on the magnitudes only: the phase carries the series' structure (periodicity,
timing) that the server's core-set tuning needs, the magnitudes carry most of what identifies a
client's level and range. The summary gives no noise law; we use multiplicative log-normal noise
on every magnitude, |X'| = |X| exp(sigma * e) with e ~ N(0, 1), which keeps magnitudes
non-negative and every nonzero frequency's phase exactly.
"""

from __future__ import annotations

import torch


def fourier_magnitude_noise(series: torch.Tensor, sigma: float, generator: torch.Generator,
                            dim: int = -2) -> torch.Tensor:
    """``series`` with log-normal noise of scale ``sigma`` on its Fourier magnitudes along
    ``dim`` (time; default the second-last axis of (..., T, V) windows), phases kept."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if sigma == 0:
        return series.clone()
    spectrum = torch.fft.rfft(series.double(), dim=dim)
    noise = torch.randn(spectrum.shape, generator=generator, dtype=torch.float64)
    noisy = torch.polar(spectrum.abs() * torch.exp(sigma * noise), spectrum.angle())
    return torch.fft.irfft(noisy, n=series.shape[dim], dim=dim).to(series.dtype)
