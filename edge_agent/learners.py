"""What an agent trains each round, behind one interface: the FedPer head (QAP + personalized
head around a shared backbone) or FedPoD prompts around a frozen foundation model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from edge_agent.data import SeriesTable, prepare_client
from edge_agent.data.canonical import device_series
from edge_agent.models.foundation import content_hash, load_foundation
from edge_agent.models.prompts import PromptedForecaster, PromptLoss, train_prompts
from edge_agent.protocol import signature
from edge_agent.storage import write_tensors_atomically
from edge_agent.train import derive_seed, make_optimizer, train_epochs

TensorDict = dict[str, torch.Tensor]
PERSONAL_FILE = "personal.safetensors"


class HeadLearner:
    """FedPer: everything under ``shared`` goes on the wire, the head stays."""

    def __init__(self, cfg, table: SeriesTable, folder: Path):
        from edge_agent.agent import load_local_model

        self.cfg, self.folder = cfg, folder
        self.data = prepare_client(table, cfg.model.lookback, cfg.model.horizon, cfg.training.stride)
        self.model = load_local_model(cfg, self.data.n_features, folder)
        self.n_features, self.n_samples = self.data.n_features, self.data.n_train
        self.signature = signature(self.model.shared_state(), cfg.model.model_dump_json())

    def load_global(self, state: TensorDict) -> None:
        self.model.load_shared_state(state)

    def train(self, round_index: int) -> float:
        t = self.cfg.training
        return train_epochs(self.model, self.data.train, t.local_epochs, t.batch_size, make_optimizer(self.model, t.lr),
                            derive_seed(self.cfg.seed, 2, round_index, self.cfg.client_index))

    def wire_state(self) -> TensorDict:
        return self.model.shared_state()

    def save(self) -> None:
        write_tensors_atomically(self.folder / PERSONAL_FILE, self.model.personal_state())

    def install_personal(self, tensors: TensorDict) -> None:
        raise ValueError("personalized prompts sent to an agent in head mode")


class PromptLearner:
    """FedPoD: prompts and small shared layers on the wire; the foundation model never changes.

    The round's global state carries the FedAvg of everyone's prompts, i.e. the global prompts
    {P}*; personalized prompts and neighbours' prompts arrive on the agent's task topic."""

    def __init__(self, cfg, table: SeriesTable, folder: Path):
        foundation = load_foundation(cfg.foundation, cfg.foundation_sha256)
        self.cfg, self.folder = cfg, folder
        self.data = device_series(table, foundation.cfg.variables, foundation.cfg.window, cfg.training.stride)
        self.model = PromptedForecaster(foundation, cfg.prompt, table.latitude or 0.0, table.longitude or 0.0)
        self.loss = PromptLoss()
        if (folder / PERSONAL_FILE).is_file():
            self._restore(load_file(str(folder / PERSONAL_FILE)))
        self.n_features, self.n_samples = table.n_features, len(self.data.train)
        self.references: dict = {}
        self.signature = prompt_signature(self.model, content_hash(foundation))

    def load_global(self, state: TensorDict) -> None:
        self.model.load_state_dict({k: v for k, v in state.items() if k.startswith("shared.")}, strict=False)
        self.references["global_prompts"] = torch.cat([state[f"prompts.{n}"].flatten() for n in self.model.prompts])

    def train(self, round_index: int) -> float:
        t = self.cfg.training
        terms = train_prompts(self.model, self.loss, self.data.train, self.data.present, t.local_epochs, t.batch_size,
                              t.lr, derive_seed(self.cfg.seed, 2, round_index, self.cfg.client_index), self.references)
        return terms["total"]

    def wire_state(self) -> TensorDict:
        """Prompts and shared layers; with ``dp_sigma`` the prompts leave with Gaussian noise
        (FedPoD Table 5: privacy applied to the prompts is enough, the graphs see only them)."""
        state = self.model.wire_state()
        if self.cfg.dp_sigma > 0:
            for name in state:
                if name.startswith("prompts."):
                    state[name] = state[name] + torch.randn_like(state[name]) * self.cfg.dp_sigma
        return state

    def save(self) -> None:
        state = {k: v for k, v in self.model.state_dict().items() if not k.startswith("foundation.")}
        state.update({f"loss.{k}": v for k, v in self.loss.state_dict().items()})
        write_tensors_atomically(self.folder / PERSONAL_FILE, state)

    def install_personal(self, tensors: TensorDict) -> None:
        """Adopt the coordinator's personalized prompts and keep them, with the neighbours', as
        the regularization targets of eq. 6."""
        personalized, neighbours = tensors["personalized"], tensors.get("neighbours")
        self.model.set_prompt_vector(personalized)
        self.references["personalized"] = personalized
        self.references["neighbours"] = list(neighbours) if neighbours is not None else []

    def _restore(self, state: TensorDict) -> None:
        self.loss.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("loss.")})
        self.model.load_state_dict({k: v for k, v in state.items() if not k.startswith("loss.")}, strict=False)


def prompt_signature(model: PromptedForecaster, foundation_hash: str) -> str:
    """Same prompt layout and the same foundation model on both sides, or no federation."""
    return signature(model.wire_state(), json.dumps({"prompt": model.cfg.model_dump(), "foundation": foundation_hash}))


def make_learner(cfg, table: SeriesTable, folder: Path) -> HeadLearner | PromptLearner:
    return PromptLearner(cfg, table, folder) if cfg.mode == "prompt" else HeadLearner(cfg, table, folder)
