"""An exported ``model.onnx`` (``edgefl export onnx``) run in ONNX Runtime behind the forecasting
calls of a torch ``Forecaster`` (``levels``, ``forward``, ``forward_quantiles``), so a gateway's
forecast and its conformal calibration run the same code on either. A model whose inputs, output
or quantile levels do not fit the agent's config is refused by name before it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from edge_agent.levels import median_index
from edge_agent.serving.onnx_serving import run_forecast

LEVELS_KEY = "quantiles"  # model.onnx metadata: a quantile model's levels, comma-separated


class OnnxForecaster(nn.Module):
    """``path`` in ONNX Runtime (CPU) for an agent whose model forecasts ``horizon`` steps with
    quantile ``levels`` (None: point forecasts); the graph's ``forecast`` is (B, H, F), or
    (B, H, F, Q) for a quantile model."""

    def __init__(self, path: Path, levels: tuple[float, ...] | None, horizon: int):
        super().__init__()
        self.path, self.levels = Path(path), levels
        self.session = open_session(self.path)
        check_outputs(self.session, self.path, levels, horizon)

    def forward(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """The point forecast (B, H, F): a quantile model's median."""
        out = self._run(x, marks)
        return out[..., median_index(self.levels)] if self.levels else out

    def forward_quantiles(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        """A quantile model's every level (B, H, F, Q)."""
        if not self.levels:
            raise ValueError(f"{self.path}: a point model has no quantiles")
        return self._run(x, marks)

    def _run(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        if "x" not in inputs:
            raise ValueError(f"{self.path}: the model has no input 'x' (inputs: {sorted(inputs)})")
        feeds = {"x": x.float().numpy(), "marks": marks.float().numpy()}
        for name, array in feeds.items():
            fixed = list(inputs[name][1:]) if name in inputs else None  # a seasonal anchor reads no marks
            if fixed is not None and list(array.shape[1:]) != fixed:
                raise ValueError(f"{self.path}: input {name!r} expects (batch, {fixed}), "
                                 f"this agent's data gives {array.shape}")
        return torch.from_numpy(run_forecast(self.session, feeds, self.path))


def open_session(path: Path) -> Any:
    """An ONNX Runtime session on ``path``; a missing or unreadable file is refused by name."""
    import onnxruntime

    if not path.is_file():
        raise ValueError(f"{path}: ONNX model not found")
    try:
        return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for unreadable files
        raise ValueError(f"{path}: not a readable ONNX model ({err})") from None


def check_outputs(session: Any, path: Path, levels: tuple[float, ...] | None, horizon: int) -> None:
    """The graph must output ``forecast`` for the horizon and levels the agent's config names: the
    same levels in its metadata (``LEVELS_KEY``, none for a point model) and one more axis for them."""
    outputs = {o.name: o.shape for o in session.get_outputs()}
    if "forecast" not in outputs:
        raise ValueError(f"{path}: the model has no output 'forecast' (outputs: {sorted(outputs)})")
    named, wanted = graph_levels(session, path), tuple(levels or ())
    if named != wanted:
        raise ValueError(f"{path}: the model forecasts {_kind(named)}, this agent's config {_kind(wanted)} "
                         "(export the agent's own model: edgefl export onnx --agent-config)")
    shape = outputs["forecast"]
    if len(shape) != (4 if levels else 3) or shape[1] != horizon or (levels and shape[-1] != len(levels)):
        raise ValueError(f"{path}: output 'forecast' has shape {shape}, this agent's config forecasts "
                         f"{horizon} steps of {_kind(wanted)}")


def graph_levels(session: Any, path: Path) -> tuple[float, ...]:
    """The quantile levels a graph's metadata names (``export.onnx.label_levels``); () for none."""
    text = session.get_modelmeta().custom_metadata_map.get(LEVELS_KEY, "")
    try:
        return tuple(float(level) for level in text.split(",")) if text else ()
    except ValueError:
        raise ValueError(f"{path}: metadata {LEVELS_KEY}={text!r} is not a list of levels") from None


def _kind(levels: tuple[float, ...]) -> str:
    return f"quantiles {levels}" if levels else "point values"
