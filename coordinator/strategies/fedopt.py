"""Server-side optimizers (Reddi et al. 2021, "Adaptive Federated Optimization", Algorithm 2): the
weighted mean of the clients' states minus the current global state is a pseudo-gradient that a
server optimizer applies with its own learning rate, instead of jumping to the mean.

FedAvgM (Hsu et al. 2019): m <- beta m + delta, theta <- theta + lr m.
FedAdam: m <- b1 m + (1 - b1) delta, v <- b2 v + (1 - b2) delta^2, theta <- theta + lr m / (sqrt(v) + tau).
BatchNorm statistics are not gradients: they are averaged as in FedAvg.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence

import torch

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategy_settings import ServerSettings, StrategySettings
from edge_agent.tensors import TensorDict

STATISTICS = ("running_mean", "running_var")


class _ServerOptimizer(Strategy):
    """The shared mechanics: mean, pseudo-gradient, per-tensor update, moments kept between rounds."""

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        return cls(settings.server)

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.moments: TensorDict = {}

    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        mean = weighted_mean([*on_time, *imputed])
        state = {}
        for name, target in mean.items():
            if name.endswith(STATISTICS):
                state[name] = target
                continue
            delta = (target.double() - current[name].double())
            state[name] = (current[name].double() + self.step(name, delta)).to(target.dtype)
        return Aggregate(state)

    @abstractmethod
    def step(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        """The change applied to tensor ``name`` given its pseudo-gradient ``delta`` (float64)."""

    def moment(self, key: str, like: torch.Tensor) -> torch.Tensor:
        return self.moments.setdefault(key, torch.zeros_like(like))

    def state_dict(self) -> TensorDict:
        return {k: v.clone() for k, v in self.moments.items()}

    def load_state_dict(self, state: TensorDict) -> None:
        self.moments = {k: v.clone() for k, v in state.items()}


class FedAvgM(_ServerOptimizer):
    """Server momentum; lr 1 and momentum 0 give FedAvg."""

    name = "fedavgm"

    def step(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        m = self.moment(f"m.{name}", delta).mul_(self.settings.momentum).add_(delta)
        return self.settings.lr * m


class FedAdam(_ServerOptimizer):
    """Adam on the server, per coordinate."""

    name = "fedadam"

    def step(self, name: str, delta: torch.Tensor) -> torch.Tensor:
        s = self.settings
        m = self.moment(f"m.{name}", delta).mul_(s.momentum).add_(delta, alpha=1 - s.momentum)
        v = self.moment(f"v.{name}", delta).mul_(s.beta2).add_(delta.pow(2), alpha=1 - s.beta2)
        return s.lr * m / (v.sqrt() + s.tau)
