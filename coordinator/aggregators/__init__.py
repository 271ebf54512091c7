"""Aggregator registry: adding one is one module plus one line here."""

from __future__ import annotations

from coordinator.aggregators.base import Aggregator, ClientUpdate, TensorDict
from coordinator.aggregators.fedavg import FedAvg

AGGREGATORS: dict[str, type[Aggregator]] = {
    FedAvg.name: FedAvg,
}


def make_aggregator(name: str) -> Aggregator:
    """Instantiate a registered aggregator by name, or fail listing the valid names."""
    try:
        return AGGREGATORS[name]()
    except KeyError:
        raise ValueError(f"aggregator: unknown {name!r}; choose one of {sorted(AGGREGATORS)}") from None


__all__ = ["AGGREGATORS", "Aggregator", "ClientUpdate", "TensorDict", "make_aggregator"]
