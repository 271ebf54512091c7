"""FedPoD (Algorithm 2, client side): prompts and small shared layers trained around a frozen
foundation model; the coordinator's personalized prompts arrive as a personal message."""

from __future__ import annotations

import copy
import json
from typing import ClassVar

import torch

from edge_agent.data.canonical import DeviceSeries
from edge_agent.learners.base import Learner
from edge_agent.models.foundation import FoundationModel, content_hash
from edge_agent.models.prompt_settings import PromptConfig
from edge_agent.models.prompts import WIRE_PREFIXES, PromptedForecaster, PromptLoss, train_prompts
from edge_agent.protocol import signature
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.training_settings import LocalTraining

TUNED_PREFIXES = ("foundation.", "shared.")  # the Table 1 baselines that fine-tune the backbone instead
REFERENCES = ("global_prompts", "personalized", "neighbours")  # the targets of eq. 6


def prompted_model(foundation: FoundationModel, cfg: PromptConfig, latitude: float, longitude: float,
                   seed: int) -> PromptedForecaster:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return PromptedForecaster(foundation, cfg, latitude, longitude)


def initial_prompt_state(foundation: FoundationModel, cfg: PromptConfig, seed: int,
                         tune_foundation: bool = False) -> TensorDict:
    """The global state of round 1: prompts and shared layers (or foundation and shared layers)."""
    template = prompted_model(foundation, cfg, 0.0, 0.0, seed_for(seed, Stream.GLOBAL_INIT))
    return template.wire_state(TUNED_PREFIXES if tune_foundation else WIRE_PREFIXES)


def prompt_signature(cfg: PromptConfig, foundation: FoundationModel, wire: TensorDict) -> str:
    """Same prompt layout (quantile levels included) and the same foundation model on both sides,
    or no federation. Fields left None stay out of it, so a point config (no ``quantiles``) keeps
    the signature it had before quantile levels existed."""
    prompt = cfg.model_dump(exclude_none=True)
    return signature(wire, json.dumps({"prompt": prompt, "foundation": content_hash(foundation)}))


class PromptLearner(Learner):
    """The round's global state carries the average of everyone's prompts; FedPoD's personal
    message replaces this client's prompts with its personalized ones, which then stay in
    place over later global states, and sets the regularization targets of eq. 6.

    ``tune_foundation`` gives the fine-tuning baselines of Table 1: the foundation model and
    the shared layers train and go on the wire, the prompts stay frozen."""

    kind: ClassVar[str] = "prompt"

    def __init__(self, foundation: FoundationModel, cfg: PromptConfig, data: DeviceSeries, latitude: float,
                 longitude: float, training: LocalTraining, seed: int, client_index: int, dp_sigma: float = 0.0,
                 tune_foundation: bool = False):
        backbone = copy.deepcopy(foundation) if tune_foundation else foundation
        self.model = prompted_model(backbone, cfg, latitude, longitude, seed_for(seed, Stream.CLIENT_INIT, client_index))
        if tune_foundation:
            self.model.foundation.requires_grad_(True)
            for p in [*self.model.prompts.parameters(), *self.model.weights.parameters()]:
                p.requires_grad_(False)
        self.prefixes = TUNED_PREFIXES if tune_foundation else WIRE_PREFIXES
        self.loss, self.data, self.training = PromptLoss(levels=cfg.quantiles), data, training
        self.seed, self.client_index, self.dp_sigma = seed, client_index, dp_sigma
        self.references: dict[str, torch.Tensor] = {}
        self.layout = layout_of(self.model.wire_state(self.prefixes))
        self.n_features, self.n_samples = int(data.present.sum()), len(data.train)
        self.signature = prompt_signature(cfg, foundation, self.model.wire_state(self.prefixes))

    def load_global(self, state: TensorDict) -> None:
        check_layout(state, self.layout, "global state")
        self.model.load_state_dict(state, strict=False)
        if "personalized" in self.references:
            self.model.set_prompt_vector(self.references["personalized"])

    def train(self, round_index: int) -> float:
        t = self.training
        terms = train_prompts(self.model, self.loss, self.data.train, self.data.present, t.local_epochs, t.batch_size,
                              t.lr, seed_for(self.seed, Stream.LOCAL_TRAINING, round_index, self.client_index),
                              self._eq6_targets())
        return terms["total"]

    def wire_state(self, round_index: int) -> TensorDict:
        """With ``dp_sigma`` the prompts leave with seeded Gaussian noise (FedPoD Table 5: privacy
        applied to the prompts is enough, the graphs see only them); the local prompts stay clean."""
        state = self.model.wire_state(self.prefixes)
        if self.dp_sigma > 0:
            generator = torch.Generator().manual_seed(
                seed_for(self.seed, Stream.PROMPT_NOISE, round_index, self.client_index))
            for name in sorted(state):
                if name.startswith("prompts."):
                    state[name] = state[name] + torch.randn(state[name].shape, generator=generator) * self.dp_sigma
        return state

    def install_personal(self, tensors: TensorDict) -> None:
        """Adopt the personalized prompts; keep them, the global prompts and the neighbours'
        prompts as the regularization targets of eq. 6."""
        size = self.model.prompt_vector().numel()
        expected = {"personalized": ((size,), torch.float32), "global_prompts": ((size,), torch.float32)}
        neighbours = tensors.get("neighbours", torch.zeros(0, size))
        check_layout({k: v for k, v in tensors.items() if k != "neighbours"}, expected, "personal message")
        if neighbours.dim() != 2 or neighbours.shape[1] != size or neighbours.dtype != torch.float32:
            raise ValueError(f"personal message: neighbours is {tuple(neighbours.shape)}, expected (k, {size})")
        self.references = {**tensors, "neighbours": neighbours}
        self.model.set_prompt_vector(tensors["personalized"])

    def personal_state(self) -> TensorDict:
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith("foundation.")}
        state.update({f"loss.{k}": v for k, v in self.loss.state_dict().items()})
        state.update({f"reference.{k}": v for k, v in self.references.items()})
        return {k: v.detach().clone() for k, v in state.items()}

    def restore(self, state: TensorDict) -> None:
        self.loss.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("loss.")})
        references = {k[10:]: v for k, v in state.items() if k.startswith("reference.")}
        if references:
            self.install_personal(references)
        own = {k: v for k, v in state.items() if not k.startswith(("loss.", "reference."))}
        check_layout(own, layout_of({k: v for k, v in self.model.state_dict().items()
                                     if not k.startswith("foundation.")}), "personal state")
        self.model.load_state_dict(own, strict=False)

    def _eq6_targets(self) -> dict[str, object]:
        refs = dict(self.references)
        if "neighbours" in refs:
            refs["neighbours"] = list(refs["neighbours"])
        return refs
