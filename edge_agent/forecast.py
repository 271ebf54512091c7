"""Forecasts on the gateway: the agent's own model (its personal part and the last global state,
as the agent saved them) on its latest local window, in torch or in ONNX Runtime; or, while the
gateway's history is too short to train on or nothing is trained yet, the foundation model alone
(zero-shot, ``edge_agent.zero_shot``) where one is configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edge_agent.config import AgentConfig
from edge_agent.data import DataError, SeriesTable, prepare_client, time_features
from edge_agent.learners import HeadLearner, make_learner, training_rows_needed
from edge_agent.learners.head import Served
from edge_agent.models import Forecaster
from edge_agent.models.foundation import load_foundation
from edge_agent.state import AgentState
from edge_agent.zero_shot import zero_shot_forecast


def load_local_model(cfg: AgentConfig, table: SeriesTable) -> Forecaster:
    """The model the agent serves, with its personal (and last global) parameters restored from disk."""
    return serving(cfg, table).model


def serving(cfg: AgentConfig, table: SeriesTable) -> Served:
    """What the agent serves now: its federated model, or with ``keep_local`` its local-only
    model where that validates better (see ``HeadLearner.serving_model``)."""
    learner = make_learner(cfg, table)
    if not isinstance(learner, HeadLearner):
        raise ValueError(f"mode {cfg.mode!r}: local forecasts and exports need a head-mode agent")
    state = AgentState(cfg.state_dir)
    return state.restore(learner).serving_model(state.trained_round() + 1)


@dataclass(frozen=True)
class Forecast:
    """The next ``horizon`` steps in the data's own units and which model made them."""

    stamps: list[str]
    columns: list[str]
    values: torch.Tensor  # (H, F)
    model: str  # "federated", "local", the ONNX file or "zero-shot foundation (why)"
    zero_shot: bool = False

    @property
    def served_by(self) -> str:
        """Which model made the forecast, as a phrase: "the federated model", "zero-shot foundation (...)"."""
        return self.model if self.zero_shot else f"the {self.model} model"


@torch.no_grad()
def forecast(cfg: AgentConfig, onnx_model: Path | None = None) -> Forecast:
    """Forecast the horizon after the latest window of local data, in the data's own units,
    with the served torch model or, given ``onnx_model`` (an ``edgefl export onnx`` model.onnx),
    ONNX Runtime; without a model of the gateway's own (see ``no_model_yet``) with the zero-shot
    foundation, where one is configured."""
    table = cfg.data.load()
    needed = training_rows_needed(cfg)
    why, checkpoint = no_model_yet(cfg, table, needed), zero_shot_checkpoint(cfg)
    if why and checkpoint and onnx_model is None:
        return _zero_shot(cfg, table, checkpoint, why)
    if table.n_rows < needed:
        meanwhile = ("set zero_shot_foundation = <checkpoint from edgefl pretrain> in the agent config for "
                     "zero-shot forecasts meanwhile" if checkpoint is None
                     else "the zero-shot foundation serves without an ONNX model")
        raise DataError(f"{table.name}: {why}; {meanwhile}")
    if not table.present[-cfg.model.lookback :].all():
        raise ValueError(f"{table.name}: the latest {cfg.model.lookback} steps have a gap; no forecast from them")
    data = prepare_client(table, cfg.model.lookback, cfg.model.horizon)
    series = data.scaler.transform(table.values[-cfg.model.lookback :]).astype("float32")[None]
    marks = time_features(table.index[-cfg.model.lookback :])[None]
    if onnx_model is None:
        served = serving(cfg, table)
        scaled = served.model.eval()(torch.from_numpy(series), torch.from_numpy(marks))[0].numpy()
        which = served.which
    else:
        scaled, which = run_onnx_forecast(Path(onnx_model), series, marks)[0], str(onnx_model)
    values = torch.as_tensor(data.scaler.inverse_transform(scaled))
    return Forecast(next_stamps(table, cfg.model.horizon), list(data.columns), values, which)


def no_model_yet(cfg: AgentConfig, table: SeriesTable, needed: int) -> str | None:
    """Why the gateway has no model of its own to serve (too little history to train on, or no
    trained state yet), or None when it has one."""
    if table.n_rows < needed:
        return f"{table.n_rows} rows of history; local training needs {needed}"
    if not AgentState(cfg.state_dir).has_trained_model():
        return f"no model trained yet in {cfg.state_dir}"
    return None


def zero_shot_checkpoint(cfg: AgentConfig) -> tuple[Path, str | None] | None:
    """The foundation checkpoint (and expected hash) for zero-shot forecasts: prompt mode's own
    foundation, head mode's ``zero_shot_foundation``; None where head mode names none."""
    if cfg.mode == "prompt":
        return cfg.foundation, cfg.foundation_sha256
    if cfg.zero_shot_foundation is None:
        return None
    return cfg.zero_shot_foundation, cfg.zero_shot_foundation_sha256


def _zero_shot(cfg: AgentConfig, table: SeriesTable, checkpoint: tuple[Path, str | None], why: str) -> Forecast:
    """The foundation model's forecast alone, for the agent's horizon."""
    horizon = cfg.prompt.horizon if cfg.mode == "prompt" else cfg.model.horizon
    values = torch.as_tensor(zero_shot_forecast(load_foundation(*checkpoint), table, horizon))
    return Forecast(next_stamps(table, horizon), list(table.columns), values, f"zero-shot foundation ({why})", True)


def next_stamps(table: SeriesTable, horizon: int) -> list[str]:
    """The ``horizon`` timestamps after the table's last row, at its last step."""
    step = table.index[-1] - table.index[-2]
    return [str(table.index[-1] + step * (h + 1)) for h in range(horizon)]


def run_onnx_forecast(path: Path, series: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """The ``forecast`` output of an exported model; a model for other shapes is refused by name."""
    import onnxruntime

    if not path.is_file():
        raise ValueError(f"{path}: ONNX model not found")
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for unreadable files
        raise ValueError(f"{path}: not a readable ONNX model ({err})") from None
    inputs = {i.name: i.shape for i in session.get_inputs()}
    for name, array in (("x", series), ("marks", marks)):
        if name not in inputs:
            raise ValueError(f"{path}: the model has no input {name!r} (inputs: {sorted(inputs)})")
        fixed = list(inputs[name][1:])
        if list(array.shape[1:]) != fixed:
            raise ValueError(f"{path}: input {name!r} expects (batch, {fixed}), this agent's data gives {array.shape}")
    return session.run(["forecast"], {"x": series, "marks": marks.astype(np.float32)})[0]
