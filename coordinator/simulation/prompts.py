"""Prompt mode in one process (FedPoD Algorithm 2 and the baselines of its Table 1): prompt
learners around one frozen foundation model, any strategy, through the coordinator's own loop."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, Field

from coordinator.pretraining import FOUNDATION_FILE
from coordinator.simulation.grid import SimulatedGrid, SimulatedRound, fleet_settings
from coordinator.simulation.participation import Participation, everyone
from coordinator.strategies import ClientInfo
from coordinator.strategy_settings import StrategySettings
from coordinator.twin_settings import TwinSettings
from edge_agent.data import SeriesTable
from edge_agent.data.canonical import device_series
from edge_agent.learners import FleetTemplate, PromptLearner
from edge_agent.learners.prompt import initial_prompt_state, prompt_signature
from edge_agent.models.foundation import FoundationModel, save_foundation
from edge_agent.models.prompt_settings import PromptConfig
from edge_agent.models.prompts import evaluate_prompts, prompt_forecasts
from edge_agent.tensors import TensorDict
from edge_agent.train import Batch, Metrics, calibrated_metrics, forecast_metrics, weighted_metrics
from edge_agent.training_settings import LocalTraining


class PromptFederationConfig(LocalTraining, TwinSettings, StrategySettings):
    """Rounds and local prompt training (appendix B.3: AdamW, lr 1e-2, batch 256); the strategy
    (``fedpod``, or ``fedavg`` for the prompts + FedAvg baseline)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(5, ge=1)
    batch_size: int = Field(256, ge=1)
    lr: float = Field(1e-2, gt=0)
    strategy: str = "fedpod"
    dp_sigma: float = Field(0.0, ge=0.0, description="std of Gaussian noise on uploaded prompts (Table 5)")
    stride: int = Field(1, ge=1, description="step between training windows")
    seed: int = 42
    test_every_round: bool = Field(False, description="also report test metrics after every round "
                                                      "(costs a pass over the validation and test splits)")


@dataclass(frozen=True)
class PromptRound:
    """Mean validation MAE / RMSE over clients after a round, the strategy's figures and the
    round's global state; ``val`` the dataset-size-weighted validation ``Metrics`` (QS, ICP and
    MIL for quantile configs) and ``test`` those of the test split with conformal ICP and MIL
    (``evaluate_prompt_fleet``), None unless ``test_every_round``."""

    round: int
    mae: float
    rmse: float
    seconds: float
    metrics: dict[str, float]
    global_state: TensorDict
    val: Metrics
    test: Metrics | None = None


def prompt_learners(tables: Sequence[SeriesTable], foundation: FoundationModel, prompt: PromptConfig,
                    cfg: PromptFederationConfig, tune_foundation: bool = False) -> list[PromptLearner]:
    """One learner per station table, seeded by its index in the fleet."""
    fm = foundation.cfg
    return [PromptLearner(foundation, prompt, device_series(t, fm.variables, fm.window, cfg.stride), t.latitude or 0.0,
                          t.longitude or 0.0, cfg, cfg.seed, i, cfg.dp_sigma, tune_foundation)
            for i, t in enumerate(tables)]


def mean_scores(learners: Sequence[PromptLearner], split: str = "val") -> tuple[float, float]:
    """(MAE, RMSE) on the standardized scale, mean over clients."""
    scores = [evaluate_prompts(lr.model, getattr(lr.data, split), lr.data.present) for lr in learners]
    return sum(s[0] for s in scores) / len(scores), sum(s[1] for s in scores) / len(scores)


def station_forecasts(learner: PromptLearner, split: str) -> Iterator[Batch]:
    """(forecast, target) batches of a learner's model over one split of its station's windows."""
    return prompt_forecasts(learner.model, getattr(learner.data, split), learner.data.present)


def validation_metrics(learners: Sequence[PromptLearner]) -> Metrics:
    """Dataset-size-weighted validation ``Metrics`` over clients (QS, ICP, MIL for quantiles)."""
    return weighted_metrics([forecast_metrics(station_forecasts(lr, "val"), lr.model.levels) for lr in learners],
                            [lr.n_samples for lr in learners])


def evaluate_prompt_fleet(learners: Sequence[PromptLearner]) -> tuple[Metrics, dict[str, Metrics]]:
    """Global (dataset-size-weighted) and per-station test metrics, as head mode's
    ``evaluate_fleet``: a quantile model's intervals are also reported calibrated on its station's
    own validation windows (split conformal)."""
    per_client = {lr.data.name: calibrated_metrics(station_forecasts(lr, "val"), station_forecasts(lr, "test"),
                                                   lr.model.levels) for lr in learners}
    return weighted_metrics(list(per_client.values()), [lr.n_samples for lr in learners]), per_client


def run_prompt_federation(tables: Sequence[SeriesTable], foundation: FoundationModel, prompt: PromptConfig,
                          cfg: PromptFederationConfig, tune_foundation: bool = False,
                          participation: Participation | None = None,
                          on_round: Callable[[PromptRound], None] | None = None,
                          ) -> tuple[list[PromptLearner], list[PromptRound]]:
    """``cfg.rounds`` rounds of ``cfg.strategy`` over one learner per station table, through the
    coordinator service's own loop (``SimulatedGrid``) with the foundation written as its
    checkpoint; returns the learners (trained) and per round the mean validation scores."""
    learners = prompt_learners(tables, foundation, prompt, cfg, tune_foundation)
    roster = [ClientInfo(t.name, lr.n_samples, t.latitude, t.longitude) for t, lr in zip(tables, learners)]
    records: list[PromptRound] = []

    def after_round(done: SimulatedRound) -> None:
        result = done.result
        test = evaluate_prompt_fleet(learners)[0] if cfg.test_every_round else None
        records.append(PromptRound(result.round, *mean_scores(learners), done.seconds, result.metrics,
                                   result.global_state, validation_metrics(learners), test))
        if on_round:
            on_round(records[-1])

    grid = SimulatedGrid(learners, roster, participation or everyone(cfg.rounds, len(learners)), after_round)
    with tempfile.TemporaryDirectory(prefix="edgefl-foundation-") as folder:
        path = Path(folder) / FOUNDATION_FILE
        fleet = fleet_settings(cfg, mode="prompt", foundation=path, foundation_sha256=save_foundation(foundation, path),
                               prompt=prompt)
        grid.run(fleet, cfg.rounds, cfg.seed, tuned_template(foundation, prompt, cfg.seed) if tune_foundation else None)
    return learners, records


def tuned_template(foundation: FoundationModel, prompt: PromptConfig, seed: int) -> FleetTemplate:
    """The fleet's model in FedPoD's fine-tuning baselines (Table 1), which no coordinator.toml
    describes: the foundation's weights travel with the prompts."""
    initial = initial_prompt_state(foundation, prompt, seed, tune_foundation=True)
    return FleetTemplate(initial, prompt_signature(prompt, foundation, initial))
