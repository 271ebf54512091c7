"""Federated pretraining of the FedPoD foundation model (appendix B.1): masked reconstruction on
every device, FedAvg over the whole model, a share ``participation`` of the devices per round."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from coordinator.aggregators import ClientUpdate, make_aggregator
from edge_agent.data.canonical import DeviceSeries
from edge_agent.models.foundation import FoundationConfig, FoundationModel, geometric_mask, masked_mse
from edge_agent.train import derive_seed


class PretrainConfig(BaseModel):
    """Rounds, local training and participation (paper: 20 rounds x 20 local epochs, C = 0.5)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rounds: int = Field(5, ge=1)
    local_epochs: int = Field(1, ge=1)
    participation: float = Field(0.5, gt=0.0, le=1.0, description="share C of devices per round")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    stride: int = Field(3, ge=1, description="step between training windows")
    seed: int = 42


@dataclass(frozen=True)
class PretrainRound:
    round: int
    devices: tuple[str, ...]
    train_loss: float
    val_loss: float
    seconds: float


def masked_batch(x: torch.Tensor, cfg: FoundationConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input with masked positions zeroed, mask) with an independent mask per sample."""
    rng = np.random.default_rng(seed)
    masks = np.stack([geometric_mask(x.shape[1], x.shape[2], cfg.mask_rate, cfg.mean_masked, rng) for _ in x])
    masked = torch.from_numpy(masks)
    return x.masked_fill(masked, 0.0), masked


def reconstruction_loss(model: FoundationModel, device: DeviceSeries, windows: torch.Tensor, seed: int,
                        batch_size: int = 256) -> float:
    """Masked MSE over all ``windows`` with masks drawn from ``seed`` (the same every call)."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            x = windows[start : start + batch_size]
            inputs, masked = masked_batch(x, model.cfg, derive_seed(seed, start))
            total += float(masked_mse(model(inputs), x, masked, device.present)) * len(x)
            count += len(x)
    return total / max(count, 1)


def local_pretraining(model: FoundationModel, device: DeviceSeries, cfg: PretrainConfig, seed: int) -> float:
    """E epochs of masked reconstruction on one device; returns the mean batch loss."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for epoch in range(cfg.local_epochs):
            for step, batch in enumerate(torch.randperm(len(device.train), generator=generator).split(cfg.batch_size)):
                x = device.train[batch]
                inputs, masked = masked_batch(x, model.cfg, derive_seed(seed, epoch, step))
                loss = masked_mse(model(inputs), x, masked, device.present)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    return float(np.mean(losses)) if losses else float("nan")


def pretrain(devices: Sequence[DeviceSeries], fm: FoundationConfig, cfg: PretrainConfig,
             on_round: Callable[[PretrainRound], None] | None = None) -> tuple[FoundationModel, list[PretrainRound]]:
    """Rounds of FedAvg pretraining; validation loss is the sample-weighted masked MSE of all devices."""
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(cfg.seed, 0))
        model = FoundationModel(fm)
    fedavg, rng = make_aggregator("fedavg"), np.random.default_rng(cfg.seed)
    per_round = max(1, math.ceil(cfg.participation * len(devices)))
    records = []
    for r in range(1, cfg.rounds + 1):
        started = time.perf_counter()
        chosen = sorted(rng.choice(len(devices), per_round, replace=False))
        updates, losses = [], []
        for i in chosen:
            local = copy.deepcopy(model)
            losses.append(local_pretraining(local, devices[i], cfg, derive_seed(cfg.seed, r, int(i))))
            updates.append(ClientUpdate(devices[i].name, local.state_dict(), len(devices[i].train)))
        model.load_state_dict(fedavg.aggregate(updates))
        sizes = [len(d.val) for d in devices]
        val = sum(reconstruction_loss(model, d, d.val, cfg.seed) * n for d, n in zip(devices, sizes)) / sum(sizes)
        weights = [u.n_samples for u in updates]
        records.append(PretrainRound(r, tuple(u.client_id for u in updates),
                                     float(np.average(losses, weights=weights)), val, time.perf_counter() - started))
        if on_round:
            on_round(records[-1])
    return model.eval(), records
