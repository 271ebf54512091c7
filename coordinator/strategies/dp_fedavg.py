"""Server-side clipping with Gaussian noise (DP-FedAvg, McMahan et al. 2018, "Learning
Differentially Private Recurrent Language Models", Algorithm 1 with flat clipping): each client's
delta from the global state is clipped to L2 norm S, the clipped deltas are summed, Gaussian
noise N(0, (z S)^2) is added to every coordinate of the sum, and the sum is divided by the
number of updates. One client moves the state by at most S / n before
noise, whatever it sends. The noise is drawn from the ``SERVER_NOISE`` seed stream of the round,
so a run is reproducible and the simulation predicts the service.

Clients are weighted equally (the paper's capped weights with w_k = 1); the privacy accounting
(moments accountant) is not done here: z and S are the operator's choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy
from coordinator.strategies.bounds import delta_norm
from coordinator.strategy_settings import NoiseSettings, StrategySettings
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict


class DPFedAvg(Strategy):
    """theta <- theta + (sum_i clip_S(theta_i - theta) + N(0, (z S)^2 I)) / n."""

    name = "dp_fedavg"

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(settings.noise, seed)

    def __init__(self, settings: NoiseSettings, seed: int):
        self.settings, self.seed = settings, seed

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        updates = [*on_time, *imputed]
        clip, std = self.settings.clip_norm, self.settings.noise_multiplier * self.settings.clip_norm
        norms = [delta_norm(current, u.params) for u in updates]
        scales = [min(1.0, clip / norm) if norm > 0 else 0.0 for norm in norms]
        generator = torch.Generator().manual_seed(seed_for(self.seed, Stream.SERVER_NOISE, round_number))
        state: TensorDict = {}
        for name, base in current.items():
            if not base.is_floating_point():
                state[name] = base
                continue
            total = sum((u.params[name].double() - base.double()) * s for u, s in zip(updates, scales))
            noise = torch.randn(base.shape, generator=generator, dtype=torch.float64) * std
            state[name] = (base.double() + (total + noise) / len(updates)).to(base.dtype)
        return Aggregate(state)
