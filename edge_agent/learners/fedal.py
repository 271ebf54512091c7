"""A FeDaL pretraining client (FeDaL, Method, client side): patching and 75% random masking of
the input, the foundation model with Domain Bias Elimination between its encoder and its
reconstruction layer, then a core-set learnt by gradient matching and noised in its Fourier
magnitudes. The upload is the whole model, with ``latent_bias`` holding this client's bias (the
server averages them into the reference b^g), plus the core-set.

The same learner with ``dbe`` and ``coreset`` switched off (and ``prox_mu`` for FedProx) is the
FedAvg / FedProx / Standalone baseline of Table 1, so the comparison changes one thing at a time.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from edge_agent.coreset import learn_coreset, mask_batch, private_coreset
from edge_agent.data.canonical import DeviceSeries
from edge_agent.learners.foundation import FoundationLearner, mean_over_batches, pretraining_signature
from edge_agent.models.dbe import DomainBiasElimination
from edge_agent.models.fedal_settings import FedalClientSettings
from edge_agent.models.foundation import FoundationModel, masked_mse
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.seeds import Stream, derive_seed, seed_for
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.train import mean_term, seeded_steps
from edge_agent.training_settings import LocalTraining

CORESET_PREFIX = "coreset."


def coreset_layout(cfg: FoundationConfig, settings: FedalClientSettings) -> TensorDict:
    """Zero tensors with the layout of the core-set part of an upload (empty without core-sets)."""
    if settings.coreset is None:
        return {}
    return {f"{CORESET_PREFIX}windows": torch.zeros(settings.coreset.size, cfg.window, len(cfg.variables)),
            f"{CORESET_PREFIX}present": torch.zeros(len(cfg.variables))}


def split_coreset(params: TensorDict) -> tuple[TensorDict, TensorDict]:
    """(model part, core-set part) of an upload."""
    model = {k: v for k, v in params.items() if not k.startswith(CORESET_PREFIX)}
    return model, {k[len(CORESET_PREFIX):]: v for k, v in params.items() if k.startswith(CORESET_PREFIX)}


def reconstruction_mse(model: FoundationModel, windows: torch.Tensor, present: torch.Tensor, patch: int,
                       rate: float, seed: int, bias: torch.Tensor | None = None, batch_size: int = 256) -> float:
    """Masked-reconstruction MSE over ``windows`` with patch masks of ``rate`` drawn from ``seed``
    (the same every call); ``bias`` replaces the model's ``latent_bias`` (a client's own)."""
    latent = model.latent_bias if bias is None else bias

    def loss(x: torch.Tensor, start: int) -> torch.Tensor:
        masked = mask_batch(x.shape, patch, rate, derive_seed(seed, start))
        hidden = model.encode(x.masked_fill(masked, 0.0))
        return masked_mse(model.reconstruct(hidden + latent[: x.shape[1]]), x, masked, present)

    return mean_over_batches(model, windows, loss, batch_size)


class FedalLearner(FoundationLearner):
    """One device pretraining the foundation model the FeDaL way; its DBE scales stay on it."""

    kind: ClassVar[str] = "fedal"

    def __init__(self, cfg: FoundationConfig, settings: FedalClientSettings, data: DeviceSeries,
                 training: LocalTraining, seed: int, client_index: int):
        super().__init__(cfg, data, training, seed, client_index)
        self.dbe = DomainBiasElimination(cfg.window, cfg.d_model, settings.dbe) if settings.dbe else None
        self.settings, self.coreset = settings, coreset_layout(cfg, settings)
        self.signature = pretraining_signature(cfg, self.wire_state(0))

    def train(self, round_index: int) -> float:
        """E epochs of masked reconstruction (+ DBE's bias term, + FedProx's), then the core-set."""
        seed = seed_for(self.seed, Stream.LOCAL_TRAINING, round_index, self.client_index)
        loss = self._fit(seed)
        if self.settings.coreset is not None:
            self._make_coreset(round_index)
        return loss

    def _fit(self, seed: int) -> float:
        self.model.train()
        modules = [self.model, *([self.dbe] if self.dbe else [])]
        optimizer = torch.optim.Adam([p for m in modules for p in m.parameters()], lr=self.training.lr)
        reference = self.model.latent_bias.clone()
        anchor = [p.detach().clone() for p in self.model.parameters()]
        steps = seeded_steps(optimizer, len(self.data.train), self.training.local_epochs, self.training.batch_size,
                             seed, lambda batch, epoch, step: self._loss(self.data.train[batch], reference, anchor,
                                                                         derive_seed(seed, epoch, step)))
        return mean_term(steps)

    def _loss(self, x: torch.Tensor, reference: torch.Tensor, anchor: list[torch.Tensor], seed: int) -> torch.Tensor:
        masked = mask_batch(x.shape, self.settings.patch, self.settings.mask_rate, seed)
        hidden = self.model.encode(x.masked_fill(masked, 0.0))
        bias = self.dbe(hidden) if self.dbe else reference[: x.shape[1]]
        loss = masked_mse(self.model.reconstruct(hidden + bias), x, masked, self.data.present)
        if self.dbe:
            loss = loss + self.dbe.regularization(bias, reference)
        if self.settings.prox_mu > 0:
            loss = loss + self.settings.prox_mu / 2 * sum((p - a).pow(2).sum()
                                                          for p, a in zip(self.model.parameters(), anchor))
        return loss

    def _make_coreset(self, round_index: int) -> None:
        settings = self.settings.coreset
        learnt = learn_coreset(self.model, self.data.train, self.data.present, settings, self.settings.patch,
                               self.settings.mask_rate, seed_for(self.seed, Stream.CORESET, round_index,
                                                                 self.client_index))
        noisy = private_coreset(learnt, self.data.present, settings.noise,
                                seed_for(self.seed, Stream.CORESET_NOISE, round_index, self.client_index))
        self.coreset = {f"{CORESET_PREFIX}windows": noisy, f"{CORESET_PREFIX}present": self.data.present.float()}

    def wire_state(self, round_index: int) -> TensorDict:
        """The model with this client's bias as ``latent_bias``, and the latest core-set."""
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.dbe is not None:
            state["latent_bias"] = self.dbe.running.detach().clone()
        return {**state, **{k: v.clone() for k, v in self.coreset.items()}}

    def global_part(self, wire: TensorDict) -> TensorDict:
        return split_coreset(wire)[0]

    def personal_state(self) -> TensorDict:
        return {k: v.detach().clone() for k, v in self.dbe.state_dict().items()} if self.dbe else {}

    def restore(self, state: TensorDict) -> None:
        if self.dbe is None:
            check_layout(state, {}, "personal state")
            return
        check_layout(state, layout_of(self.dbe.state_dict()), "personal state")
        self.dbe.load_state_dict(state)

    def own_bias(self) -> torch.Tensor | None:
        """This client's bias for evaluating it on its own data (None without DBE)."""
        return None if self.dbe is None else self.dbe.running.detach().clone()
