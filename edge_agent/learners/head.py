"""FedPer (FedQAPer Algorithm 2): QAP + backbone are shared and averaged, the slot embeddings and
the forecast head stay on the device."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from edge_agent.candidates import FEDERATED, LOCAL, SERVING_PREFIX, VALIDATION_PREFIX
from edge_agent.data import TIME_FEATURES, ClientData
from edge_agent.learners.base import Learner
from edge_agent.learners.companion import LocalCompanion
from edge_agent.learners.private import ANCHOR, UPLOADED, PrivateModel
from edge_agent.models import Forecaster, ModelConfig, build_forecaster
from edge_agent.protocol import signature
from edge_agent.seeds import Stream, seed_for
from edge_agent.selection import Served, present, select
from edge_agent.tensors import TensorDict, check_layout, layout_of
from edge_agent.train import make_optimizer, train_epochs
from edge_agent.training_settings import HeadTraining

PRIVATE = "private."  # Fed-GAME: the private model's shared part in the personal state


def client_model(cfg: ModelConfig, n_features: int, seed: int, client_index: int) -> Forecaster:
    """Client ``client_index``'s forecaster before its first round."""
    return build_forecaster(cfg, n_features, TIME_FEATURES, seed_for(seed, Stream.CLIENT_INIT, client_index))


def initial_shared_state(cfg: ModelConfig, seed: int) -> TensorDict:
    """The global shared state of round 1 (the shared part does not depend on a client's features)."""
    return build_forecaster(cfg, 1, TIME_FEATURES, seed_for(seed, Stream.GLOBAL_INIT)).shared_state()


def head_signature(cfg: ModelConfig, shared: TensorDict) -> str:
    return signature(shared, cfg.model_dump_json())


class HeadLearner(Learner):
    """Everything under ``shared`` goes on the wire; the personal part stays. Each round first fits
    the personal part to the received shared part (``personal_epochs``), then trains the shared
    part, alone (``alternate``) or with the personal part, optionally held near the received
    shared part (``prox_mu``). With ``private_model`` (Fed-GAME) the received shared part is
    installed only once, at the start; later ones anchor the proximal term, and the strategy's
    personalized differences move the model (``install_personal``)."""

    kind: ClassVar[str] = "head"

    def __init__(self, cfg: ModelConfig, data: ClientData, training: HeadTraining, seed: int, client_index: int,
                 live: bool = False):
        """``live``: a gateway's own learner, which chooses what to serve at its present (every
        outcome in its data known); otherwise a simulated one, which chooses before its test windows."""
        self.data, self.training, self.seed, self.client_index = data, training, seed, client_index
        self.live = live
        self.model = client_model(cfg, data.n_features, seed, client_index)
        self.n_features, self.n_samples = data.n_features, data.n_train
        self.signature = head_signature(cfg, self.model.shared_state())
        self.received: TensorDict = self.model.shared_state()
        self._fitted: tuple[int, TensorDict] | None = None
        self.private = PrivateModel(training.personal_step) if training.private_model else None
        self._started = False
        self.alone = LocalCompanion(client_model(cfg, data.n_features, seed, client_index), data, training, seed,
                                    client_index, training.local_patience) if training.keep_local else None

    def load_global(self, state: TensorDict) -> None:
        if self.private is None or not self._started:
            self.model.load_shared_state(state)
            self._started = True
        else:
            check_layout(state, layout_of(self.received), "shared state")
        if any(not torch.equal(state[k], self.received[k]) for k in state):
            self._fitted = None  # a remembered personal phase belongs to the previous global state
        self.received = {k: v.clone() for k, v in state.items()}

    def train(self, round_index: int) -> float:
        self._fit_personal(self.model, round_index)
        t = self.training
        trained = self.model.shared if t.alternate else self.model
        loss = train_epochs(self.model, self.data.train, t.epochs_over(len(self.data.train)), t.batch_size, make_optimizer(trained, t.lr),
                            seed_for(self.seed, Stream.LOCAL_TRAINING, round_index, self.client_index),
                            self._proximal() if t.prox_mu > 0 else None, t.max_steps)
        if self.alone is not None:
            if round_index > 1:  # joined a fleet that has trained: its local model starts from the fleet's
                self.alone.start_from(self.received)
            self.alone.step()
        if self.private is not None:
            self.private.record(self.received, self.model.shared_state())
        return loss

    def serving_model(self, round_index: int, anchors: Sequence[str] | None = None,
                      median: bool | None = None, at: int | None = None, combine: int | None = None) -> Served:
        """What this gateway serves once ``round_index`` is announced: the federated model (its
        personal part fitted to the installed global state, as the round's training starts), or,
        where it scores better on the latest ``selection_days`` of validation windows, its
        local-only model (``keep_local``, once it has trained), one of the anchors
        (``training.anchors``, or ``anchors`` where given) or the median of them all
        (``training.median``, or ``median`` where given), chosen at row ``at`` of its data (None: its
        present when ``live``, else before its test windows; ``edge_agent.selection``), the mean of
        the ``training.combine`` best (or ``combine`` where given)."""
        models = {FEDERATED: self.federated_model(round_index)}
        if self.alone is not None and math.isfinite(self.alone.best_val):
            models[LOCAL] = self.alone.best_model()
        t = self.training
        clock = present(self.data) if at is None and self.live else at
        return select(self.data, models, t.anchors if anchors is None else anchors,
                      t.median if median is None else median, t.selection_days, clock,
                      t.combine if combine is None else combine)

    def federated_model(self, round_index: int) -> Forecaster:
        """The federated model once ``round_index`` is announced: with ``personal_epochs``, a copy
        whose personal part is fitted to the installed global state (fitted once a round), else the
        model itself. What the gateway serves unless a better candidate wins (``serving_model``)."""
        if not self.training.personal_epochs:
            return self.model
        model = copy.deepcopy(self.model)
        self._fit_personal(model, round_index)
        return model

    def serving_metrics(self, round_index: int) -> dict[str, float]:
        """With ``keep_local`` or ``anchors``: every candidate's validation score (``val.<name>``;
        MASE, QS for quantile models) and which are served (``serving.<name>``, each its share of
        the served mean)."""
        if self.alone is None and not self.training.anchors:
            return {}
        served = self.serving_model(round_index)
        scores = {VALIDATION_PREFIX + name: score for name, score in served.scores.items() if math.isfinite(score)}
        picks = served.picks or (served.which,)
        return {**scores, **{SERVING_PREFIX + name: 1.0 / len(picks) for name in picks}}

    def wire_state(self, round_index: int) -> TensorDict:
        return self.model.shared_state()

    def install_personal(self, tensors: TensorDict) -> None:
        """Fed-GAME: the round's personalized difference of the selected shared tensors (eq. 2)."""
        if self.private is None:
            raise ValueError("personal messages (Fed-GAME's personalized differences) need a private model: "
                             "set training.private_model = true")
        self.model.load_state_dict(self.private.personalized(tensors, layout_of(self.received)), strict=False)

    def personal_state(self) -> TensorDict:
        alone = {f"alone.{k}": v for k, v in self.alone.state().items()} if self.alone else {}
        private = {PRIVATE + k: v for k, v in self.model.shared_state().items()} if self.private and self._started else {}
        return {**self.model.personal_state(), **alone, **private, **(self.private.state() if self.private else {})}

    def restore(self, state: TensorDict) -> None:
        own = {k: v for k, v in state.items() if not k.startswith(("alone.", PRIVATE, ANCHOR, UPLOADED))}
        check_layout(own, layout_of(self.model.personal_state()), "personal state")
        self.model.load_state_dict(own, strict=False)
        if self.private is not None:
            self._restore_private(state)
        if self.alone is not None and "alone.progress" in state:
            self.alone.restore({k[6:]: v for k, v in state.items() if k.startswith("alone.")})

    def _restore_private(self, state: TensorDict) -> None:
        """Fed-GAME: the private model's shared part and its last upload, where saved."""
        shared = layout_of(self.received)
        private = {k[len(PRIVATE):]: v for k, v in state.items() if k.startswith(PRIVATE)}
        if private:
            self.model.load_shared_state(private)
            self._started = True
        self.private.restore(state, shared)

    def _fit_personal(self, model: Forecaster, round_index: int) -> None:
        """The round's personal phase on ``model``. Its result is remembered for the round, so
        serving a round and then training it (the simulation does both) fits only once; the fit
        is deterministic, so reusing it changes nothing."""
        if not self.training.personal_epochs:
            return
        if self._fitted is not None and self._fitted[0] == round_index:
            model.load_state_dict(self._fitted[1], strict=False)
            return
        train_epochs(model, self.data.train, self.training.personal_epochs, self.training.batch_size,
                     make_optimizer(model.personal, self.training.lr),
                     seed_for(self.seed, Stream.PERSONAL_PHASE, round_index, self.client_index))
        self._fitted = (round_index, model.personal_state())

    def _proximal(self) -> Callable[[], torch.Tensor]:
        """FedProx: mu/2 times the squared distance of the shared parameters from the received ones."""
        anchors = [(p, self.received[f"shared.{name}"]) for name, p in self.model.shared.named_parameters()]
        mu = self.training.prox_mu
        return lambda: mu / 2 * sum((p - anchor).pow(2).sum() for p, anchor in anchors)

