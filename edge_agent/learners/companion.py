"""Never worse than alone: a gateway's own local-only model, trained beside the federated one.

It trains one epoch per call (more under ``min_steps``, each validated) with a persistent Adam and the local-only baseline's early stopping
(FedQAPer 4.3.1): the state with the best validation score (MSE; QS for quantile models) is
kept, and training stops after ``patience`` epochs without improvement. Nothing of it is ever
sent. ``run_local_only`` is this class run for ``max_epochs``, so the companion of a federation
equals the baseline.
"""

from __future__ import annotations

import copy
import math

import torch

from edge_agent.data import ClientData
from edge_agent.models import Forecaster
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.train import evaluate, make_optimizer, train_epochs
from edge_agent.training_settings import HeadTraining


class LocalCompanion:
    """One client's local-only model and its early-stopping bookkeeping."""

    def __init__(self, model: Forecaster, data: ClientData, training: HeadTraining, seed: int, client_index: int,
                 patience: int):
        self.model, self.data, self.training, self.patience = model, data, training, patience
        self.seed, self.client_index = seed, client_index
        self.optimizer = make_optimizer(model, training.lr)
        self.best_val, self.best = math.inf, copy.deepcopy(model.state_dict())
        self.epochs, self.waited = 0, 0

    @property
    def stopped(self) -> bool:
        return self.waited >= self.patience

    def start_from(self, shared: TensorDict) -> None:
        """Start from the fleet's model: a companion that has not trained yet takes ``shared`` (the
        global shared state its gateway received) as its first state, so a gateway that joins a
        fleet which has already trained fine-tunes the fleet's model on its own rows instead of
        learning from a random start (fine-tuning, the simplest personalization of a global
        model; Wang et al. 2019, "Federated evaluation of on-device personalization")."""
        if self.epochs:
            return
        self.model.load_shared_state(shared)
        self.best = copy.deepcopy(self.model.state_dict())

    def step(self) -> None:
        """One round's training: one epoch (at most ``max_steps`` steps of it), or as many as
        ``min_steps`` asks for, each validated so early stopping keeps the best epoch however many a
        round holds."""
        for _ in range(self.training.epochs_over(len(self.data.train), 1)):
            if self.stopped:
                return
            self.epochs += 1
            train_epochs(self.model, self.data.train, 1, self.training.batch_size, self.optimizer,
                         seed_for(self.seed, Stream.LOCAL_ONLY_EPOCH, self.client_index, self.epochs),
                         max_steps=self.training.max_steps)
            val = evaluate(self.model, self.data.val).score
            if val < self.best_val:
                self.best_val, self.best, self.waited = val, copy.deepcopy(self.model.state_dict()), 0
            else:
                self.waited += 1

    def best_model(self) -> Forecaster:
        """A copy of the model in its best validation state."""
        model = copy.deepcopy(self.model)
        model.load_state_dict(self.best)
        return model.eval()

    def state(self) -> TensorDict:
        """Everything needed to go on after a restart (Adam's moments start afresh)."""
        out = {f"model.{k}": v for k, v in self.model.state_dict().items()}
        out.update({f"best.{k}": v for k, v in self.best.items()})
        out["progress"] = torch.tensor([self.best_val, float(self.epochs), float(self.waited)], dtype=torch.float64)
        return {k: v.detach().clone() for k, v in out.items()}

    def restore(self, state: TensorDict) -> None:
        own = layout_of(self.model.state_dict())
        check_layout({k[6:]: v for k, v in state.items() if k.startswith("model.")}, own, "local companion")
        check_layout({k[5:]: v for k, v in state.items() if k.startswith("best.")}, own, "local companion")
        self.model.load_state_dict({k[6:]: v for k, v in state.items() if k.startswith("model.")})
        self.best = {k[5:]: v.clone() for k, v in state.items() if k.startswith("best.")}
        best_val, epochs, waited = state["progress"].tolist()
        self.best_val, self.epochs, self.waited = best_val, int(epochs), int(waited)
