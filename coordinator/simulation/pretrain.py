"""Federated pretraining of the foundation model through the coordinator service's own loop
(``SimulatedGrid``, the coordinator in pretrain mode), a share
``participation`` of the devices per round:

- ``fedavg``: FedPoD's pretraining (appendix B.1): geometric masks, FedAvg over the whole model;
- ``fedal``: FeDaL (arXiv 2508.04045, Method): patch masks, Domain Bias Elimination and core-sets
  on the devices, Global Bias Elimination on the server.

``client`` settings with ``strategy = "fedavg"`` give FeDaL's baselines (FedAvg, FedProx) on the
same patch masks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from coordinator.simulation.grid import SimulatedGrid, SimulatedRound
from coordinator.simulation.participation import Participation, sampled
from coordinator.simulation.pretrain_config import PretrainConfig
from coordinator.strategies import ClientInfo
from edge_agent.data.canonical import DeviceSeries
from edge_agent.learners import FoundationLearner, Learner
from edge_agent.learners.fedal import FedalLearner, reconstruction_mse
from edge_agent.learners.foundation import foundation_model, reconstruction_loss
from edge_agent.models.foundation import FoundationModel
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.tensors import TensorDict


@dataclass(frozen=True)
class PretrainRound:
    """A closed round: who trained, the losses, the wall time and the global state it produced."""

    round: int
    devices: tuple[str, ...]
    train_loss: float
    val_loss: float
    seconds: float
    global_state: TensorDict = field(default_factory=dict, repr=False)


def pretrain(devices: Sequence[DeviceSeries], fm: FoundationConfig, cfg: PretrainConfig,
             on_round: Callable[[PretrainRound], None] | None = None, *,
             participation: Participation | None = None,
             learners: Sequence[Learner] | None = None) -> tuple[FoundationModel, list[PretrainRound]]:
    """Rounds of federated pretraining; validation loss is the sample-weighted masked MSE of the
    global model on every device's validation windows. ``participation``: who takes part in
    each round (default: a share ``cfg.participation`` sampled per round; a service's test
    passes what its fleet did); ``learners`` (default: fresh ``pretraining_learners``) may be
    passed to read their state afterwards, e.g. FeDaL's own biases."""
    model = foundation_model(fm, cfg.seed)
    learners = pretraining_learners(devices, fm, cfg) if learners is None else learners
    roster = [ClientInfo(d.name, len(d.train)) for d in devices]
    plan = participation or sampled(cfg.rounds, len(devices), cfg.participation, cfg.seed)
    sizes = [len(d.val) for d in devices]
    records: list[PretrainRound] = []

    def after_round(done: SimulatedRound) -> None:
        model.load_state_dict(done.result.global_state)
        val = sum(validation_loss(model, d, cfg) * n for d, n in zip(devices, sizes)) / sum(sizes)
        records.append(PretrainRound(done.result.round, done.result.on_time, done.result.loss, val, done.seconds,
                                     done.result.global_state))
        if on_round:
            on_round(records[-1])

    fleet = {"mode": "pretrain", "foundation_model": fm, "fedal_client": cfg.device_side, "strategy": cfg.strategy,
             "fedal": cfg.server.model_copy(update={"model": fm})}
    SimulatedGrid(learners, roster, plan, after_round).run(fleet, cfg.rounds, cfg.seed)
    return model.eval(), records


def pretrain_standalone(devices: Sequence[DeviceSeries], fm: FoundationConfig, cfg: PretrainConfig) -> list[Learner]:
    """FeDaL's Standalone baseline (Table 1): every device trains alone from the same initial
    model, in exactly the rounds it would take part in (same local epochs and seeds), never
    averaged; each learner's ``model`` is its own."""
    initial = foundation_model(fm, cfg.seed).state_dict()
    learners = pretraining_learners(devices, fm, cfg)
    plan = sampled(cfg.rounds, len(devices), cfg.participation, cfg.seed)
    for learner, rounds in zip(learners, plan.present.T):
        learner.load_global(initial)
        for number in rounds.nonzero()[0] + 1:
            learner.train(int(number))
    return learners


def pretraining_learners(devices: Sequence[DeviceSeries], fm: FoundationConfig, cfg: PretrainConfig) -> list[Learner]:
    """One learner per device: FeDaL's when ``cfg.client`` is set, else FedPoD's plain one."""
    client = cfg.device_side
    if client is None:
        return [FoundationLearner(fm, d, cfg, cfg.seed, i) for i, d in enumerate(devices)]
    return [FedalLearner(fm, client, d, cfg, cfg.seed, i) for i, d in enumerate(devices)]


def validation_loss(model: FoundationModel, device: DeviceSeries, cfg: PretrainConfig,
                    windows: str = "val") -> float:
    """Masked MSE of ``model`` on a device's windows with the masks the run trains on."""
    data, client = getattr(device, windows), cfg.device_side
    if client is None:
        return reconstruction_loss(model, device, data, cfg.seed)
    return reconstruction_mse(model, data, device.present, client.patch, client.mask_rate, cfg.seed)
