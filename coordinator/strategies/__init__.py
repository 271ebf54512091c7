"""Strategies: how a round's updates become the next global state. The registry and every
strategy's settings are torch-free, in ``coordinator.strategy_settings``; adding a federated
method is one module here plus one line in its ``STRATEGIES``."""

from __future__ import annotations

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategies.participation import RoundPolicy
from coordinator.strategy_settings import STRATEGIES, StrategySettings
from edge_agent.tensors import TensorDict


def make_strategy(settings: StrategySettings, initial: TensorDict, seed: int) -> Strategy:
    """The configured strategy for a fleet whose round-1 global state is ``initial``."""
    return STRATEGIES[settings.strategy].from_settings(initial, settings, seed)


__all__ = ["Aggregate", "ClientInfo", "ClientUpdate", "RoundPolicy", "Strategy", "make_strategy", "weighted_mean"]
