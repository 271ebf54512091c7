"""Learner registry: what a gateway trains in each mode. Adding a mode is one module plus one
line in ``LEARNERS`` and its two builders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge_agent.config import AgentConfig, FleetModel
from edge_agent.data.canonical import device_series
from edge_agent.data.windows import ClientData, prepare_client
from edge_agent.learners.base import Learner
from edge_agent.learners.fedal import FedalLearner, coreset_layout
from edge_agent.learners.foundation import FoundationLearner, foundation_model, pretraining_signature
from edge_agent.learners.head import HeadLearner, head_signature, initial_shared_state
from edge_agent.learners.prompt import PromptLearner, initial_prompt_state, prompt_signature
from edge_agent.models.foundation import load_foundation
from edge_agent.protocol import largest_envelope
from edge_agent.rows_needed import training_rows_needed
from edge_agent.tensors import Layout, TensorDict, layout_of

if TYPE_CHECKING:
    from edge_agent.data.table import SeriesTable


@dataclass(frozen=True)
class FleetTemplate:
    """What the coordinator needs of the fleet's model: the round-1 global state, the signature
    every agent's model must show and ``extras``, zero tensors laid out as what an update carries
    beyond the global state (FeDaL's core-sets; none in the other modes)."""

    initial: TensorDict
    signature: str
    extras: TensorDict = field(default_factory=dict)

    @property
    def update_layout(self) -> Layout:
        """The layout every update must show: the global state plus the extras."""
        return layout_of({**self.initial, **self.extras})


def _head_learner(cfg: AgentConfig, table: SeriesTable) -> Learner:
    from edge_agent.data.table import check_interval  # pandas: loaded already with the table

    check_interval(table, cfg.model.interval_ns)
    return head_learner(cfg, prepare_client(table, cfg.model.lookback, cfg.model.horizon, cfg.training.stride))


def head_learner(cfg: AgentConfig, data: ClientData) -> HeadLearner:
    """A head-mode learner on data prepared already (the training process gets it from
    ``edge_agent.round_data``, prepared with ``cfg.model``'s lookback and horizon and ``cfg.training.stride``);
    live: it chooses what to serve on every outcome its data holds."""
    return HeadLearner(cfg.model, data, cfg.training, cfg.seed, cfg.client_index, live=True)


def _prompt_learner(cfg: AgentConfig, table: SeriesTable) -> Learner:
    foundation = load_foundation(cfg.foundation, cfg.foundation_sha256)
    data = device_series(table, foundation.cfg.variables, foundation.cfg.window, cfg.training.stride)
    return PromptLearner(foundation, cfg.prompt, data, table.latitude or 0.0, table.longitude or 0.0, cfg.training,
                         cfg.seed, cfg.client_index, cfg.dp_sigma)


def _pretrain_learner(cfg: AgentConfig, table: SeriesTable) -> Learner:
    fm = cfg.foundation_model
    data = device_series(table, fm.variables, fm.window, cfg.training.stride)
    if cfg.fedal_client is None:
        return FoundationLearner(fm, data, cfg.training, cfg.seed, cfg.client_index)
    return FedalLearner(fm, cfg.fedal_client, data, cfg.training, cfg.seed, cfg.client_index)


def _head_template(cfg: FleetModel, seed: int) -> FleetTemplate:
    initial = initial_shared_state(cfg.model, seed)
    return FleetTemplate(initial, head_signature(cfg.model, initial))


def _prompt_template(cfg: FleetModel, seed: int) -> FleetTemplate:
    foundation = load_foundation(cfg.foundation, cfg.foundation_sha256)
    initial = initial_prompt_state(foundation, cfg.prompt, seed)
    return FleetTemplate(initial, prompt_signature(cfg.prompt, foundation, initial))


def _pretrain_template(cfg: FleetModel, seed: int) -> FleetTemplate:
    fm = cfg.foundation_model
    initial = {k: v.detach().clone() for k, v in foundation_model(fm, seed).state_dict().items()}
    extras = coreset_layout(fm, cfg.fedal_client) if cfg.fedal_client else {}
    return FleetTemplate(initial, pretraining_signature(fm, {**initial, **extras}), extras)


LEARNERS: dict[str, tuple[Callable[[AgentConfig, SeriesTable], Learner], Callable[[FleetModel, int], FleetTemplate]]] = {
    HeadLearner.kind: (_head_learner, _head_template),
    PromptLearner.kind: (_prompt_learner, _prompt_template),
    "pretrain": (_pretrain_learner, _pretrain_template),
}


def make_learner(cfg: AgentConfig, table: SeriesTable) -> Learner:
    """The learner an ``agent.toml`` asks for, on the gateway's own data."""
    return LEARNERS[cfg.mode][0](cfg, table)


def fleet_template(cfg: FleetModel, seed: int) -> FleetTemplate:
    """The round-1 global state and model signature of a fleet (the coordinator's side)."""
    return LEARNERS[cfg.mode][1](cfg, seed)


def largest_message(cfg: FleetModel) -> int:
    """The largest legal message of a fleet: an update (the global state plus its extras) under the
    largest header; round announcements carry the global state alone. The broker's limit."""
    return largest_envelope(fleet_template(cfg, seed=0).update_layout)


__all__ = ["LEARNERS", "FedalLearner", "FleetTemplate", "FoundationLearner", "HeadLearner", "Learner", "PromptLearner",
           "fleet_template", "head_learner", "largest_message", "make_learner", "training_rows_needed"]
