"""Strategy registry: adding a federated method is one module plus one line in ``STRATEGIES``."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, Field, field_validator

from coordinator.strategies.base import Aggregate, ClientInfo, ClientUpdate, Strategy, weighted_mean
from coordinator.strategies.bounds import RobustSettings
from coordinator.strategies.dp_fedavg import DPFedAvg, NoiseSettings
from coordinator.strategies.fedal import FeDaL, GBESettings
from coordinator.strategies.fedavg import FedAvg
from coordinator.strategies.fedgame import FedGAME
from coordinator.strategies.fedopt import FedAdam, FedAvgM, ServerSettings
from coordinator.strategies.fedpod import FedPoD, GraphSettings
from coordinator.strategies.game import GameSettings
from coordinator.strategies.median import Median
from coordinator.strategies.participation import ParticipationSettings, RoundPolicy
from coordinator.strategies.trimmed_mean import TrimmedMean
from edge_agent.registry import registered
from edge_agent.tensors import TensorDict


class StrategySettings(BaseModel):
    """Which strategy aggregates and its settings: the same fields in simulations and
    ``coordinator.toml``."""

    strategy: str = Field("fedavg", description="how a round's updates are combined")
    fedpod: GraphSettings = Field(GraphSettings(), description="fedpod: graph training and personalization")
    server: ServerSettings = Field(ServerSettings(), description="fedavgm / fedadam: the server optimizer")
    robust: RobustSettings = Field(RobustSettings(), description="weight caps and norm bounds every update "
                                   "passes, and trimmed_mean's trim share")
    noise: NoiseSettings = Field(NoiseSettings(), description="dp_fedavg: clip norm and noise multiplier")
    fedal: GBESettings = Field(GBESettings(), description="fedal: Global Bias Elimination (correction, core-set "
                               "tuning, fusion)")
    game: GameSettings = Field(GameSettings(), description="fedgame: server learning rate and the GAME aggregator")
    participation: ParticipationSettings = Field(ParticipationSettings(), description="the round policy: who is "
                                                 "asked to train, when a round closes, who is left out")

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, name: str) -> str:
        return registered(name, STRATEGIES, "strategy")


STRATEGIES: dict[str, Callable[[TensorDict, StrategySettings, int], Strategy]] = {
    FedAvg.name: lambda initial, settings, seed: FedAvg(),
    FedAvgM.name: lambda initial, settings, seed: FedAvgM(settings.server),
    FedAdam.name: lambda initial, settings, seed: FedAdam(settings.server),
    FedPoD.name: lambda initial, settings, seed: FedPoD(initial, settings.fedpod, seed),
    Median.name: lambda initial, settings, seed: Median(),
    TrimmedMean.name: lambda initial, settings, seed: TrimmedMean(settings.robust.trim_fraction),
    DPFedAvg.name: lambda initial, settings, seed: DPFedAvg(settings.noise, seed),
    FeDaL.name: lambda initial, settings, seed: FeDaL(initial, settings.fedal, seed),
    FedGAME.name: lambda initial, settings, seed: FedGAME(initial, settings.game, seed),
}


def make_strategy(settings: StrategySettings, initial: TensorDict, seed: int) -> Strategy:
    """The configured strategy for a fleet whose round-1 global state is ``initial``."""
    return STRATEGIES[settings.strategy](initial, settings, seed)


__all__ = [
    "STRATEGIES", "Aggregate", "ClientInfo", "ClientUpdate", "GBESettings", "GameSettings", "GraphSettings",
    "NoiseSettings", "ParticipationSettings", "RobustSettings", "RoundPolicy",
    "ServerSettings", "Strategy",
    "StrategySettings",
    "make_strategy", "weighted_mean",
]
