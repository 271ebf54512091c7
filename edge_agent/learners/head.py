"""FedPer (FedQAPer Algorithm 2): QAP + backbone are shared and averaged, the slot embeddings and
the forecast head stay on the device."""

from __future__ import annotations

from typing import ClassVar

from edge_agent.data import TIME_FEATURES, ClientData
from edge_agent.learners.base import Learner
from edge_agent.models import Forecaster, ModelConfig, build_forecaster
from edge_agent.protocol import signature
from edge_agent.seeds import Stream, seed_for
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.train import LocalTraining, make_optimizer, train_epochs


def client_model(cfg: ModelConfig, n_features: int, seed: int, client_index: int) -> Forecaster:
    """Client ``client_index``'s forecaster before its first round."""
    return build_forecaster(cfg, n_features, TIME_FEATURES, seed_for(seed, Stream.CLIENT_INIT, client_index))


def initial_shared_state(cfg: ModelConfig, seed: int) -> TensorDict:
    """The global shared state of round 1 (the shared part does not depend on a client's features)."""
    return build_forecaster(cfg, 1, TIME_FEATURES, seed_for(seed, Stream.GLOBAL_INIT)).shared_state()


def head_signature(cfg: ModelConfig, shared: TensorDict) -> str:
    return signature(shared, cfg.model_dump_json())


class HeadLearner(Learner):
    """Everything under ``shared`` goes on the wire; the personal part stays."""

    kind: ClassVar[str] = "head"

    def __init__(self, cfg: ModelConfig, data: ClientData, training: LocalTraining, seed: int, client_index: int):
        self.data, self.training, self.seed, self.client_index = data, training, seed, client_index
        self.model = client_model(cfg, data.n_features, seed, client_index)
        self.n_features, self.n_samples = data.n_features, data.n_train
        self.signature = head_signature(cfg, self.model.shared_state())

    def load_global(self, state: TensorDict) -> None:
        self.model.load_shared_state(state)

    def train(self, round_index: int) -> float:
        t = self.training
        return train_epochs(self.model, self.data.train, t.local_epochs, t.batch_size, make_optimizer(self.model, t.lr),
                            seed_for(self.seed, Stream.LOCAL_TRAINING, round_index, self.client_index))

    def wire_state(self, round_index: int) -> TensorDict:
        return self.model.shared_state()

    def personal_state(self) -> TensorDict:
        return self.model.personal_state()

    def restore(self, state: TensorDict) -> None:
        check_layout(state, layout_of(self.model.personal_state()), "personal state")
        self.model.load_state_dict(state, strict=False)
