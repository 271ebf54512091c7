"""Masked-reconstruction pretraining of FedPoD's foundation model on one device (appendix B.1):
the whole model is trained and goes on the wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
from torch import nn

from edge_agent.data.canonical import DeviceSeries
from edge_agent.learners.base import Learner
from edge_agent.models.foundation import FoundationModel, geometric_mask, masked_mse
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.protocol import signature
from edge_agent.seeds import Stream, derive_seed, seed_for
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.train import mean_term, seeded_steps
from edge_agent.training_settings import LocalTraining


def foundation_model(cfg: FoundationConfig, seed: int) -> FoundationModel:
    """The untrained foundation model of a pretraining run (its round-1 global state)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed_for(seed, Stream.GLOBAL_INIT))
        return FoundationModel(cfg)


def pretraining_signature(cfg: FoundationConfig, upload: TensorDict) -> str:
    """The model signature of a pretraining fleet: the model's config and the layout of what a
    device uploads (so an agent without the core-sets a FeDaL fleet expects is refused at hello)."""
    return signature(upload, cfg.model_dump_json())


def masked_batch(x: torch.Tensor, cfg: FoundationConfig, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input with masked positions zeroed, mask) with an independent mask per sample."""
    rng = np.random.default_rng(seed)
    masks = np.stack([geometric_mask(x.shape[1], x.shape[2], cfg.mask_rate, cfg.mean_masked, rng) for _ in x])
    masked = torch.from_numpy(masks)
    return x.masked_fill(masked, 0.0), masked


def reconstruction_loss(model: FoundationModel, device: DeviceSeries, windows: torch.Tensor, seed: int,
                        batch_size: int = 256) -> float:
    """Masked MSE over all ``windows`` with masks drawn from ``seed`` (the same every call)."""

    def loss(x: torch.Tensor, start: int) -> torch.Tensor:
        inputs, masked = masked_batch(x, model.cfg, seed_for(seed, Stream.MASKS, start))
        return masked_mse(model(inputs), x, masked, device.present)

    return mean_over_batches(model, windows, loss, batch_size)


def mean_over_batches(model: nn.Module, windows: torch.Tensor, loss: Callable[[torch.Tensor, int], torch.Tensor],
                      batch_size: int) -> float:
    """Sample-weighted mean of ``loss(batch, start)`` over ``windows`` in eval mode, without gradients."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            x = windows[start : start + batch_size]
            total += float(loss(x, start)) * len(x)
            count += len(x)
    return total / max(count, 1)


def local_pretraining(model: FoundationModel, device: DeviceSeries, training: LocalTraining, seed: int) -> float:
    """E epochs of masked reconstruction on one device with a fresh Adam; returns the mean batch loss."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=training.lr)

    def step_loss(batch: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
        x = device.train[batch]
        inputs, masked = masked_batch(x, model.cfg, derive_seed(seed, epoch, step))
        return masked_mse(model(inputs), x, masked, device.present)

    return mean_term(seeded_steps(optimizer, len(device.train), training.local_epochs, training.batch_size, seed,
                                  step_loss))


class FoundationLearner(Learner):
    """One device pretraining the shared foundation model; nothing of it is personal."""

    kind: ClassVar[str] = "foundation"

    def __init__(self, cfg: FoundationConfig, data: DeviceSeries, training: LocalTraining, seed: int,
                 client_index: int):
        with torch.random.fork_rng():
            torch.manual_seed(seed_for(seed, Stream.CLIENT_INIT, client_index))
            self.model = FoundationModel(cfg)
        self.data, self.training, self.seed, self.client_index = data, training, seed, client_index
        self.layout = layout_of(self.model.state_dict())
        self.n_features, self.n_samples = int(data.present.sum()), len(data.train)
        self.signature = pretraining_signature(cfg, self.model.state_dict())

    def load_global(self, state: TensorDict) -> None:
        check_layout(state, self.layout, "global state")
        self.model.load_state_dict(state)

    def train(self, round_index: int) -> float:
        return local_pretraining(self.model, self.data, self.training,
                                 seed_for(self.seed, Stream.LOCAL_TRAINING, round_index, self.client_index))

    def wire_state(self, round_index: int) -> TensorDict:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def personal_state(self) -> TensorDict:
        return {}

    def restore(self, state: TensorDict) -> None:
        check_layout(state, {}, "personal state")
