"""Forecasts on the gateway: the agent's own model (its personal part and the last global state,
as the agent saved them) on its latest local window, in torch or in ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from edge_agent.config import AgentConfig
from edge_agent.data import SeriesTable, prepare_client, time_features
from edge_agent.learners import HeadLearner, make_learner
from edge_agent.models import Forecaster
from edge_agent.state import AgentState


def load_local_model(cfg: AgentConfig, table: SeriesTable) -> Forecaster:
    """The agent's forecaster with its personal (and last global) parameters restored from disk."""
    learner = make_learner(cfg, table)
    if not isinstance(learner, HeadLearner):
        raise ValueError(f"mode {cfg.mode!r}: local forecasts and exports need a head-mode agent")
    return AgentState(cfg.state_dir).restore(learner).model


@torch.no_grad()
def forecast(cfg: AgentConfig, onnx_model: Path | None = None) -> tuple[list[str], list[str], torch.Tensor]:
    """Forecast the horizon after the latest window of local data, in the data's own units,
    with the torch model or, given ``onnx_model`` (an ``edgefl export onnx`` model.onnx), ONNX Runtime.

    Returns (timestamps, column names, values of shape (H, F)).
    """
    table = cfg.data.load()
    if not table.present[-cfg.model.lookback :].all():
        raise ValueError(f"{table.name}: the latest {cfg.model.lookback} steps have a gap; no forecast from them")
    data = prepare_client(table, cfg.model.lookback, cfg.model.horizon)
    series = data.scaler.transform(table.values[-cfg.model.lookback :]).astype("float32")[None]
    marks = time_features(table.index[-cfg.model.lookback :])[None]
    if onnx_model is None:
        model = load_local_model(cfg, table).eval()
        scaled = model(torch.from_numpy(series), torch.from_numpy(marks))[0].numpy()
    else:
        scaled = run_onnx_forecast(Path(onnx_model), series, marks)[0]
    values = torch.as_tensor(data.scaler.inverse_transform(scaled))
    step = table.index[-1] - table.index[-2]
    stamps = [str(table.index[-1] + step * (h + 1)) for h in range(cfg.model.horizon)]
    return stamps, list(data.columns), values


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
