"""Seeded synthetic series for scale tests: trend + daily/weekly seasonality + noise, with per-client shifts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from edge_agent.data.table import SeriesTable

DAY, WEEK = 24, 168


def synthetic_table(
    n_features: int,
    n_steps: int,
    seed: int,
    name: str = "synthetic",
    shift: float = 0.0,
    noise_seed: int | None = None,
) -> SeriesTable:
    """Hourly series from 2021-01-01; `shift` offsets every feature by 2*shift*scale and scales it by exp(shift/2).

    Feature parameters come from `seed`; the noise too unless `noise_seed` gives it its own stream.
    """
    if n_features < 1 or n_steps < 1:
        raise ValueError(f"synthetic_table: n_features and n_steps must be >= 1, got {n_features}, {n_steps}")
    rng = np.random.default_rng(seed)
    level = rng.normal(0.0, 5.0, n_features)
    scale = rng.uniform(0.5, 3.0, n_features)
    trend = rng.normal(0.0, 1.0, n_features)
    daily, weekly = rng.uniform(0.5, 2.0, n_features), rng.uniform(0.2, 1.0, n_features)
    phase_d, phase_w = rng.uniform(0.0, 2 * np.pi, (2, n_features))
    noise_std = rng.uniform(0.05, 0.3, n_features)
    noise_rng = rng if noise_seed is None else np.random.default_rng(noise_seed)
    t = np.arange(n_steps, dtype=np.float64)[:, None]
    pattern = (
        trend * t / n_steps
        + daily * np.sin(2 * np.pi * t / DAY + phase_d)
        + weekly * np.sin(2 * np.pi * t / WEEK + phase_w)
        + noise_std * noise_rng.standard_normal((n_steps, n_features))
    )
    values = level + 2.0 * shift * scale + scale * np.exp(shift / 2.0) * pattern
    index = pd.date_range("2021-01-01", periods=n_steps, freq="h")
    width = len(str(n_features - 1))
    columns = tuple(f"f{j:0{width}d}" for j in range(n_features))
    return SeriesTable(name, index, values.astype(np.float32), columns)


def synthetic_clients(n_clients: int, n_features: int, n_steps: int, seed: int) -> list[SeriesTable]:
    """Clients client00, client01, ... of one seeded process, each with its own noise and a shift in [-1, 1]."""
    if n_clients < 1:
        raise ValueError(f"synthetic_clients: n_clients must be >= 1, got {n_clients}")
    noise_seeds = np.random.SeedSequence(seed).generate_state(n_clients)
    shifts = np.linspace(-1.0, 1.0, n_clients) if n_clients > 1 else np.zeros(1)
    width = max(2, len(str(n_clients - 1)))
    return [
        synthetic_table(n_features, n_steps, seed, f"client{k:0{width}d}", float(shift), int(noise))
        for k, (noise, shift) in enumerate(zip(noise_seeds, shifts))
    ]
