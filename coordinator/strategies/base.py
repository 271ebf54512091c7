"""The one interface every strategy implements (in the spirit of Flower's ``Strategy``): given a
round's updates, the next global state and any per-client messages; plus what it keeps between
rounds. The round engine runs strategies in the simulation and in the service alike."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from coordinator.strategy_settings import StrategySettings
from edge_agent.tensors import TensorDict, flat64, unflat


@dataclass(frozen=True)
class ClientUpdate:
    """What one client sent for a round (or what its twin forecast), with its sample count."""

    client_id: str
    params: TensorDict
    n_samples: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientInfo:
    """A registered client as the coordinator knows it."""

    client_id: str
    n_samples: int
    latitude: float | None = None
    longitude: float | None = None


@dataclass
class Aggregate:
    """A strategy's answer to a round: the next global state, per-client messages by client id,
    and figures worth recording (e.g. a graph loss)."""

    global_state: TensorDict
    personal: dict[str, TensorDict] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class Strategy(ABC):
    """Turns a round's updates into the next global state (and per-client messages)."""

    name: ClassVar[str]

    @abstractmethod
    def aggregate(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
                  imputed: Sequence[ClientUpdate], roster: Mapping[str, ClientInfo]) -> Aggregate:
        """Combine the on-time updates and the twins' forecasts (at least one update in all) into
        the state that follows ``current``; ``roster`` holds every registered client."""

    @classmethod
    def from_settings(cls, initial: TensorDict, settings: StrategySettings, seed: int) -> Strategy:
        """This strategy as ``settings`` configure it, for a fleet whose round-1 global state is ``initial``."""
        return cls()

    def state_dict(self) -> TensorDict:
        """What the strategy keeps between rounds (persisted by the service after every round)."""
        return {}

    def load_state_dict(self, state: TensorDict) -> None:
        """Reinstall a ``state_dict`` after a restart."""


def weighted_mean(updates: Sequence[ClientUpdate]) -> TensorDict:
    """sum_i w_i theta_i with w_i = |D_i| / sum_j |D_j| (FedAvg), summed in float64 in the order
    given and cast back to each tensor's dtype (one flat vector per client: the same float64
    operations per element as a loop over tensors, so the same bits, at a few calls per client)."""
    if not updates:
        raise ValueError("averaging needs at least one client update")
    total = sum(update.n_samples for update in updates)
    if total <= 0:
        raise ValueError("averaging needs a positive total sample count")
    names = list(updates[0].params)
    acc = torch.zeros(sum(updates[0].params[n].numel() for n in names), dtype=torch.float64)
    for update in updates:
        acc += flat64(update.params, names) * (update.n_samples / total)
    return unflat(acc, updates[0].params, names)
