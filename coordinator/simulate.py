"""In-process federation: every client of a fleet trained in one process, rounds of FedPer."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from pydantic import ConfigDict, Field

from coordinator.aggregators import ClientUpdate, TensorDict, make_aggregator
from coordinator.dropout import Participation
from coordinator.twins import TwinHistory, TwinSettings, impute_missing, make_forecaster
from edge_agent.data import TIME_FEATURES, ClientData
from edge_agent.models import Forecaster, ModelConfig, build_forecaster
from edge_agent.train import (
    Metrics,
    derive_seed,
    evaluate,
    make_optimizer,
    train_epochs,
    weighted_metrics,
)


class FederationConfig(TwinSettings):
    """Rounds and local training of a federation (FedQAPer Algorithm 2) and how missing clients
    are handled (``twin``: a FedDTW forecaster name, ``drop`` = plain FedAvg over present ones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(10, ge=1, description="global rounds G")
    local_epochs: int = Field(1, ge=1, description="local epochs E per round")
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    seed: int = 42
    aggregator: str = "fedavg"
    test_every_round: bool = Field(
        True, description="report test metrics after every round (costs a pass over the test split)"
    )


@dataclass(frozen=True)
class RoundRecord:
    """Global metrics after one round's aggregation (dataset-size-weighted over clients).

    ``test`` is None when the federation was told not to evaluate the test split every round.
    ``imputed`` clients entered aggregation as forecasts of the ``twin`` forecaster; ``dropped``
    ones were missing and had no (recent enough) history; ``late`` ones trained but arrived after the round
    closed (twin history only).
    """

    round: int
    train_loss: float
    val: Metrics
    test: Metrics | None
    seconds: float
    present: tuple[str, ...] = ()
    imputed: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    late: tuple[str, ...] = ()
    twin: str = "drop"


@dataclass
class FederationResult:
    """Per-round history; ``test`` is taken at the round with the best global validation MSE.

    ``shared`` is the global shared state after the last round; ``models`` are the clients'
    models as of the best round.
    """

    records: list[RoundRecord]
    best_round: int
    test: Metrics
    client_test: dict[str, Metrics]
    shared: TensorDict
    models: list[Forecaster]


def init_fleet(
    clients: Sequence[ClientData], cfg: ModelConfig, seed: int
) -> tuple[list[Forecaster], TensorDict]:
    """One model per client; every client starts from the same global shared parameters."""
    models = [
        build_forecaster(cfg, c.n_features, TIME_FEATURES, derive_seed(seed, 1, i))
        for i, c in enumerate(clients)
    ]
    initial = build_forecaster(cfg, 1, TIME_FEATURES, derive_seed(seed, 0)).shared_state()
    return models, initial


def run_round(
    models: Sequence[Forecaster],
    clients: Sequence[ClientData],
    global_shared: TensorDict,
    fed: FederationConfig,
    round_index: int,
    training: Sequence[int] | None = None,
) -> tuple[list[ClientUpdate], float]:
    """Each client in ``training`` (default: all) installs the global shared part, trains E
    epochs and reports its shared part.

    A fresh optimizer per round keeps clients stateless between rounds apart from their
    personal parameters. Returns the updates (in client order) and the sample-weighted loss.
    """
    updates, losses = [], []
    chosen = range(len(clients)) if training is None else training
    for i in chosen:
        model, client = models[i], clients[i]
        model.load_shared_state(global_shared)
        loss = train_epochs(
            model,
            client.train,
            fed.local_epochs,
            fed.batch_size,
            make_optimizer(model, fed.lr),
            derive_seed(fed.seed, 2, round_index, i),
        )
        updates.append(ClientUpdate(client.name, model.shared_state(), client.n_train))
        losses.append(loss)
    sizes = [u.n_samples for u in updates]
    return updates, sum(l * n for l, n in zip(losses, sizes)) / sum(sizes) if updates else float("nan")


def run_federation(
    clients: Sequence[ClientData],
    cfg: ModelConfig,
    fed: FederationConfig,
    on_round: Callable[[RoundRecord], None] | None = None,
    participation: Participation | None = None,
) -> FederationResult:
    """Run ``fed.rounds`` rounds of FedPer over ``clients`` and evaluate after each round.

    ``participation`` (rounds x clients, default everyone every round) says whose update arrives
    on time; missing clients are imputed by the ``fed.twin`` forecaster from their history
    (FedDTW Algorithm 5), and late updates only feed that history.
    """
    aggregator, forecaster = make_aggregator(fed.aggregator), make_forecaster(fed.twin)
    history = TwinHistory(forecaster.window)
    present, late = _participation_matrices(participation, fed.rounds, len(clients))
    models, global_shared = init_fleet(clients, cfg, fed.seed)
    sizes = [c.n_train for c in clients]
    records: list[RoundRecord] = []
    best_val, best_round, best_states = float("inf"), 0, None
    for r in range(1, fed.rounds + 1):
        started = time.perf_counter()
        training = [i for i in range(len(clients)) if present[r - 1, i] or late[r - 1, i]]
        updates, loss = run_round(models, clients, global_shared, fed, r, training)
        on_time = [u for i, u in zip(training, updates) if present[r - 1, i]]
        missing = [(c.name, c.n_train) for i, c in enumerate(clients) if not present[r - 1, i]]
        imputation = impute_missing(missing, history, forecaster, r, fed.twin_max_age)
        for update in updates:
            history.observe(update.client_id, r, update.params)
        if on_time or imputation.updates:
            global_shared = aggregator.aggregate(on_time + imputation.updates)
        for model in models:
            model.load_shared_state(global_shared)
        val = weighted_metrics([evaluate(m, c.val) for m, c in zip(models, clients)], sizes)
        test = evaluate_fleet(models, clients)[0] if fed.test_every_round else None
        records.append(RoundRecord(
            r, loss, val, test, time.perf_counter() - started,
            present=tuple(u.client_id for u in on_time), imputed=tuple(imputation.imputed),
            dropped=tuple(imputation.dropped),
            late=tuple(u.client_id for i, u in zip(training, updates) if not present[r - 1, i]),
            twin=forecaster.name,
        ))
        if val.mse < best_val:
            best_val, best_round = val.mse, r
            best_states = [copy.deepcopy(m.state_dict()) for m in models]
        if on_round:
            on_round(records[-1])
    for model, state in zip(models, best_states or []):
        model.load_state_dict(state)
    test, client_test = evaluate_fleet(models, clients)
    return FederationResult(records, best_round, test, client_test, global_shared, list(models))


def _participation_matrices(
    participation: Participation | None, rounds: int, clients: int
) -> tuple[np.ndarray, np.ndarray]:
    """(present, late) as rounds x clients arrays; everyone on time when none is given."""
    if participation is None:
        return np.ones((rounds, clients), dtype=bool), np.zeros((rounds, clients), dtype=bool)
    if participation.present.shape != (rounds, clients):
        raise ValueError(
            f"participation matrix is {participation.present.shape}, expected (rounds, clients) = {(rounds, clients)}"
        )
    return participation.present.astype(bool), participation.late.astype(bool)


def evaluate_fleet(
    models: Sequence[Forecaster], clients: Sequence[ClientData]
) -> tuple[Metrics, dict[str, Metrics]]:
    """Global (dataset-size-weighted) and per-client test metrics."""
    per_client = {c.name: evaluate(m, c.test) for m, c in zip(models, clients)}
    return weighted_metrics(list(per_client.values()), [c.n_train for c in clients]), per_client
