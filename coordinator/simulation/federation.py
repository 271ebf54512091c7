"""FedPer in one process (FedQAPer Algorithm 2): head learners over feature-level non-IID clients,
evaluated after every round."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from coordinator.simulation.federation_config import FederationConfig
from coordinator.simulation.grid import SimulatedGrid, SimulatedRound, Tamper, fleet_settings
from coordinator.simulation.participation import Participation, everyone, policy_driven
from coordinator.strategies import ClientInfo, RoundPolicy
from edge_agent.data import ClientData
from edge_agent.learners import HeadLearner
from edge_agent.models import Forecaster, ModelConfig
from edge_agent.selection import Served
from edge_agent.tensors import TensorDict
from edge_agent.train import Metrics, calibrated_metrics, weighted_metrics
from edge_agent.training_settings import HeadTraining


@dataclass(frozen=True)
class RoundRecord:
    """Global metrics after one round's aggregation (dataset-size-weighted over clients).

    ``test`` is None when the federation was told not to evaluate the test split every round.
    ``imputed`` clients entered aggregation as forecasts of the ``twin`` forecaster; ``dropped``
    ones were missing and had no (recent enough) history; ``late`` ones trained but arrived after
    the round closed (twin history, and a stand-in at the next close: ``stale``); ``serving_local`` ones serve their local-only model
    (``keep_local``); ``serving`` says what every client serves (federated, local or an anchor); ``rejected`` ones failed the engine's
    screening (client id -> code); ``client_val`` is each client's validation metrics and ``trust``
    the engine's trust after the round (``strategies.trust``). ``wire_bytes`` is the mean number of bytes a client that
    trained exchanged with the coordinator (update up, global state and personal message down).
    Metrics are those of the served models.
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
    serving_local: tuple[str, ...] = ()
    rejected: dict[str, str] = field(default_factory=dict)
    wire_bytes: float = 0.0
    serving: dict[str, str] = field(default_factory=dict)
    stale: tuple[str, ...] = ()
    client_val: dict[str, Metrics] = field(default_factory=dict)
    trust: dict[str, float] = field(default_factory=dict)


@dataclass
class FederationResult:
    """Per-round history; ``test`` is taken at the round with the best global validation score
    (MSE; QS for quantile models) or the last round (see ``tested_round``).

    ``shared`` is the global shared state after the last round, ``states`` the global state of
    every round; ``served`` is what each client served as of the best round and ``models`` each
    client's served model (its federated model of that round where it served an anchor).
    ``federated`` and ``client_federated`` score the federated models alone at that round (fleet
    and per client), so what serving adds over them can be read from one run.
    """

    records: list[RoundRecord]
    best_round: int
    test: Metrics
    client_test: dict[str, Metrics]
    shared: TensorDict
    states: list[TensorDict]
    models: list[Forecaster]
    served: list[Served] = field(default_factory=list)
    federated: Metrics | None = None
    client_federated: dict[str, Metrics] = field(default_factory=dict)


def head_learners(clients: Sequence[ClientData], cfg: ModelConfig, training: HeadTraining,
                  seed: int) -> list[HeadLearner]:
    """One learner per client, each seeded by its index in the fleet (as ``client_index`` in agent.toml)."""
    return [HeadLearner(cfg, client, training, seed, i) for i, client in enumerate(clients)]


def run_federation(
    clients: Sequence[ClientData],
    cfg: ModelConfig,
    fed: FederationConfig,
    on_round: Callable[[RoundRecord], None] | None = None,
    participation: Participation | None = None,
    tamper: Tamper | None = None,
    claims: Mapping[str, int] | None = None,
) -> FederationResult:
    """Run ``fed.rounds`` rounds over ``clients`` through the coordinator service's own loop
    (``SimulatedGrid``) and evaluate after each round.

    ``participation`` (default everyone every round) says whose update arrives on time; missing
    clients are imputed by the ``fed.twin`` forecaster from their history (FedDTW Algorithm 5).
    ``tamper`` alters updates as they leave the clients (attacks, see ``SimulatedGrid``); ``claims``
    are sample counts clients declare at hello instead of their true ones (lying gateways).
    """
    if participation is None and fed.participation.sampling:
        policy = RoundPolicy(fed.participation, 1, fed.seed)
        participation = policy_driven(policy, fed.rounds, [c.name for c in clients])
    participation = participation or everyone(fed.rounds, len(clients))
    if participation.present.shape != (fed.rounds, len(clients)):
        raise ValueError(f"participation matrix is {participation.present.shape}, "
                         f"expected (rounds, clients) = {(fed.rounds, len(clients))}")
    learners = head_learners(clients, cfg, fed, fed.seed)
    roster = [ClientInfo(c.name, (claims or {}).get(c.name, c.n_train)) for c in clients]
    sizes = [c.n_train for c in clients]
    records, states, best = [], [], {"val": float("inf"), "round": 0, "served": None, "federated": None}

    def after_round(done: SimulatedRound) -> None:
        r = done.result
        choices = [lr.serving_model(r.round + 1) for lr in learners]
        client_val = {c.name: choice.metrics(c, "val") for choice, c in zip(choices, clients)}
        val = weighted_metrics(list(client_val.values()), sizes)
        test = served_metrics(choices, clients)[0] if fed.test_every_round else None
        serving = {c.name: choice.label for c, choice in zip(clients, choices)}
        local = tuple(name for name, which in serving.items() if which == "local")
        records.append(RoundRecord(r.round, r.loss, val, test, done.seconds, r.on_time, r.imputed, r.dropped,
                                   done.late, r.twin, local, r.rejected, mean_bytes(done.bytes_per_client), serving,
                                   r.stale, client_val, r.trust))
        states.append(r.global_state)
        if val.score < best["val"] or fed.tested_round == "last":
            best.update(val=val.score, round=r.round, served=[frozen(choice) for choice in choices],
                        federated=[copy.deepcopy(lr.federated_model(r.round + 1)) for lr in learners])
        if on_round:
            on_round(records[-1])

    grid = SimulatedGrid(learners, roster, participation, after_round, tamper)
    final = grid.run(fleet_settings(fed, model=cfg), fed.rounds, fed.seed)
    served = best["served"] or [Served("federated", learner.model) for learner in learners]
    test, client_test = served_metrics(served, clients)
    own = best["federated"] or [learner.model for learner in learners]  # the reported round's federated models
    models = [choice.model or model for choice, model in zip(served, own)]
    federated = evaluate_fleet(own, clients)
    return FederationResult(records, best["round"], test, client_test, final, states, models, served, *federated)


def frozen(choice: Served) -> Served:
    """A served candidate with its own copy of every model (later rounds go on training the originals)."""
    model, members, candidates = copy.deepcopy((choice.model, choice.members, choice.candidates))
    return replace(choice, model=model, members=members, candidates=candidates)


def mean_bytes(sizes: Mapping[str, int]) -> float:
    """The mean of per-client byte counts (0 for a round nobody trained in)."""
    return sum(sizes.values()) / len(sizes) if sizes else 0.0


def evaluate_fleet(
    models: Sequence[Forecaster], clients: Sequence[ClientData]
) -> tuple[Metrics, dict[str, Metrics]]:
    """Global (dataset-size-weighted) and per-client test metrics of one model per client."""
    return served_metrics([Served("model", model) for model in models], clients)


def served_metrics(served: Sequence[Served], clients: Sequence[ClientData]) -> tuple[Metrics, dict[str, Metrics]]:
    """Global (dataset-size-weighted) and per-client test metrics of what each client serves,
    re-chosen once a day through the test windows (``Served.batches``); a quantile model's intervals
    are also reported calibrated on its client's own validation windows (split conformal)."""
    per_client = {c.name: calibrated_metrics(choice.batches(c, "val"), choice.batches(c, "test"), choice.levels,
                                             c.test.scale)
                  for choice, c in zip(served, clients)}
    return weighted_metrics(list(per_client.values()), [c.n_train for c in clients]), per_client
