"""How much history a gateway's learner needs before it can train, torch-free: the training agent
waits for it without building a learner."""

from __future__ import annotations

from typing import TYPE_CHECKING

from edge_agent.data.arrays import min_training_rows

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig

DEVICE_HORIZON = 1  # device_series cuts whole windows; one step is split off only to reuse prepare_client


def device_rows_needed(window: int) -> int:
    """The least history ``edge_agent.data.canonical.device_series`` accepts for ``window``-long windows."""
    return min_training_rows(window, DEVICE_HORIZON)


def training_rows_needed(cfg: AgentConfig) -> int:
    """The least history the learner of ``cfg.mode`` trains on (its ``prepare_client`` split)."""
    if cfg.mode == "prompt":
        return device_rows_needed(cfg.prompt.lookback + cfg.prompt.horizon)
    if cfg.mode == "pretrain":
        return device_rows_needed(cfg.foundation_model.window)
    return min_training_rows(cfg.model.lookback, cfg.model.horizon)
