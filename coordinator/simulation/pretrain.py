"""Federated pretraining of the FedPoD foundation model (appendix B.1): masked reconstruction on
every device, FedAvg over the whole model, a share ``participation`` of the devices per round,
all through the round engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ConfigDict, Field

from coordinator.engine import RoundEngine
from coordinator.simulation.participation import sampled
from coordinator.simulation.rounds import SimulatedRound, run_rounds
from coordinator.strategies import ClientInfo, StrategySettings, make_strategy
from coordinator.twins import TwinSettings
from edge_agent.data.canonical import DeviceSeries
from edge_agent.learners import FoundationLearner
from edge_agent.learners.foundation import foundation_model, reconstruction_loss
from edge_agent.models.foundation import FoundationConfig, FoundationModel
from edge_agent.train import LocalTraining


class PretrainConfig(LocalTraining):
    """Rounds, local training and participation (paper: 20 rounds x 20 local epochs, C = 0.5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(5, ge=1)
    participation: float = Field(0.5, gt=0.0, le=1.0, description="share C of devices per round")
    batch_size: int = Field(64, ge=1)
    stride: int = Field(3, ge=1, description="step between training windows")
    seed: int = 42


@dataclass(frozen=True)
class PretrainRound:
    round: int
    devices: tuple[str, ...]
    train_loss: float
    val_loss: float
    seconds: float


def pretrain(devices: Sequence[DeviceSeries], fm: FoundationConfig, cfg: PretrainConfig,
             on_round: Callable[[PretrainRound], None] | None = None) -> tuple[FoundationModel, list[PretrainRound]]:
    """Rounds of FedAvg pretraining; validation loss is the sample-weighted masked MSE of all devices."""
    model = foundation_model(fm, cfg.seed)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    learners = [FoundationLearner(fm, d, cfg, cfg.seed, i) for i, d in enumerate(devices)]
    roster = [ClientInfo(d.name, len(d.train)) for d in devices]
    settings = StrategySettings()
    engine = RoundEngine(make_strategy(settings, initial, cfg.seed), TwinSettings(), robust=settings.robust)
    plan = sampled(cfg.rounds, len(devices), cfg.participation, cfg.seed)
    sizes = [len(d.val) for d in devices]
    records: list[PretrainRound] = []

    def after_round(done: SimulatedRound) -> None:
        model.load_state_dict(done.result.global_state)
        val = sum(reconstruction_loss(model, d, d.val, cfg.seed) * n for d, n in zip(devices, sizes)) / sum(sizes)
        records.append(PretrainRound(done.result.round, done.result.on_time, done.result.loss, val, done.seconds))
        if on_round:
            on_round(records[-1])

    run_rounds(learners, roster, engine, initial, plan, after_round)
    return model.eval(), records
