"""Reference points for a federation: every client alone, and all data pooled in one place."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from coordinator.simulation.federation import evaluate_fleet
from coordinator.simulation.federation_config import FederationConfig
from edge_agent.data import ClientData
from edge_agent.learners.companion import LocalCompanion
from edge_agent.learners.head import client_model, initial_shared_state
from edge_agent.models import Forecaster, ModelConfig
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict
from edge_agent.train import (
    Metrics, early_stopping, evaluate, forecast_loss, make_optimizer, seeded_steps, weighted_metrics,
)
from edge_agent.training_settings import HeadTraining


@dataclass(frozen=True)
class TrainingBudget:
    """How long a baseline may train: epochs with early stopping, batch size, Adam lr, seed."""

    max_epochs: int
    patience: int
    batch_size: int
    lr: float
    seed: int
    min_steps: int = 0
    max_steps: int = 0

    @classmethod
    def matching(cls, fed: FederationConfig) -> TrainingBudget:
        """The one baseline definition: as many epochs as the federation's rounds x local epochs,
        the companion's patience, the same batch size, learning rate, seed and steps per round."""
        return cls(fed.rounds * fed.local_epochs, fed.local_patience, fed.batch_size, fed.lr, fed.seed, fed.min_steps,
                   fed.max_steps)


@dataclass
class BaselineResult:
    """Global test metrics (dataset-size weighted), per-client test metrics and epochs, and each
    client's model (none for a rule such as seasonal naive)."""

    test: Metrics
    client_test: dict[str, Metrics]
    epochs: dict[str, int]
    models: list[Forecaster] = field(default_factory=list)


def fleet_models(clients: Sequence[ClientData], cfg: ModelConfig, seed: int) -> list[Forecaster]:
    """Every client's model as a federation would start it (same seeds as its learner)."""
    return [client_model(cfg, c.n_features, seed, i) for i, c in enumerate(clients)]


def run_local_only(clients: Sequence[ClientData], cfg: ModelConfig, budget: TrainingBudget,
                   start: TensorDict | None = None) -> BaselineResult:
    """Each client trains its own full model on its own data with early stopping (FedQAPer 4.3.1):
    the ``LocalCompanion`` a federated gateway keeps, stepped ``budget.max_epochs`` times (one epoch
    each, more under ``min_steps``), from a random start or, given ``start``, from that fleet's
    shared state (``LocalCompanion.start_from``: a gateway that joined a trained fleet)."""
    training = HeadTraining(batch_size=budget.batch_size, lr=budget.lr, min_steps=budget.min_steps,
                            max_steps=budget.max_steps)
    best, epochs = [], {}
    for i, (model, client) in enumerate(zip(fleet_models(clients, cfg, budget.seed), clients)):
        alone = LocalCompanion(model, client, training, budget.seed, i, budget.patience)
        if start is not None:
            alone.start_from(start)
        for _ in range(budget.max_epochs):
            alone.step()
        epochs[client.name] = alone.epochs
        best.append(alone.best_model())
    return BaselineResult(*evaluate_fleet(best, clients), epochs, best)


def run_centralized(clients: Sequence[ClientData], cfg: ModelConfig, budget: TrainingBudget) -> BaselineResult:
    """One shared part trained on every client's batches, interleaved, by one optimizer.

    Personal parts stay per client (their shapes differ), so this is the non-private upper
    reference for FedPer: same model, no rounds, no averaging.
    """
    models = fleet_models(clients, cfg, budget.seed)
    models[0].load_shared_state(initial_shared_state(cfg, budget.seed))
    for model in models[1:]:
        model.shared = models[0].shared
    fleet = nn.ModuleList(models)
    optimizer = make_optimizer(fleet, budget.lr)
    batch_size, seed = budget.batch_size, budget.seed
    sizes = [c.n_train for c in clients]

    def run_epoch(epoch: int) -> None:
        """Every client's batches once, in a shuffled interleaving: each step the next batch of the
        client whose turn comes (its own shuffled order, drawn from the same generator as it goes)."""
        generator = torch.Generator().manual_seed(seed_for(seed, Stream.CENTRALIZED_ORDER, epoch))
        iterators = [iter(c.train.batches(batch_size, True, generator)) for c in clients]
        order = [i for i, c in enumerate(clients) for _ in range(-(-len(c.train) // batch_size))]

        def step_loss(turn: torch.Tensor, _epoch: int, _step: int) -> torch.Tensor:
            client = order[int(turn)]
            return forecast_loss(models[client], *next(iterators[client]))

        fleet.train()
        seeded_steps(optimizer, len(order), 1, 1, seed_for(seed, Stream.CENTRALIZED_DROPOUT, epoch), step_loss,
                     generator=generator)

    def validate() -> float:
        return weighted_metrics([evaluate(m, c.val) for m, c in zip(models, clients)], sizes).score

    epochs = early_stopping(fleet, run_epoch, validate, budget.max_epochs, budget.patience)
    return BaselineResult(*evaluate_fleet(models, clients), {c.name: epochs for c in clients}, models)
