"""Forecasts on the gateway: the agent's own model (its personal part and the last global state,
as the agent saved them) on its latest local window, in torch or in ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edge_agent.config import AgentConfig
from edge_agent.data import SeriesTable, prepare_client, time_features
from edge_agent.learners import HeadLearner, make_learner
from edge_agent.learners.head import Served
from edge_agent.models import Forecaster
from edge_agent.state import AgentState


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
    model: str  # "federated", "local" or the ONNX file


@torch.no_grad()
def forecast(cfg: AgentConfig, onnx_model: Path | None = None) -> Forecast:
    """Forecast the horizon after the latest window of local data, in the data's own units,
    with the served torch model or, given ``onnx_model`` (an ``edgefl export onnx`` model.onnx),
    ONNX Runtime."""
    table = cfg.data.load()
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
    step = table.index[-1] - table.index[-2]
    stamps = [str(table.index[-1] + step * (h + 1)) for h in range(cfg.model.horizon)]
    return Forecast(stamps, list(data.columns), values, which)


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
