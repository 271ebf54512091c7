"""Forecasts from a serving bundle with ONNX Runtime and numpy alone (no torch, no pandas): what
a gateway publishes. The bundle (``serving.json`` + ``model.onnx``) is written by the agent after
every accepted round (``edge_agent.serving.bundle``); its JSON is checked like any input."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_agent.serving.calendar import calendar_features
from edge_agent.times import iso, iso_ns

MODEL_FILE, INFO_FILE = "model.onnx", "serving.json"
MAX_INFO_BYTES = 1 << 20


class BundleInfo(BaseModel):
    """``serving.json``: what the model reads and forecasts, and how its inputs are scaled."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    round: int = Field(ge=0)
    model: str = Field(description="which model is served: federated, local, a seasonal anchor or their median")
    columns: list[str] = Field(min_length=1)
    mean: list[float]
    std: list[float]
    lookback: int = Field(ge=1)
    horizon: int = Field(ge=1)
    step_ns: int = Field(gt=0)
    levels: list[float] = Field(default_factory=list, description="quantile levels; empty for point forecasts")
    onnx_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    verified_max_error: float = Field(ge=0.0, description="ONNX Runtime vs torch on the latest windows")
    non_negative: list[bool] = Field(default_factory=list, description="per column: never negative in the history, "
                                     "so its forecast is floored at 0 (empty: no floor)")

    @model_validator(mode="after")
    def _consistent(self) -> BundleInfo:
        if not len(self.mean) == len(self.std) == len(self.columns) or len(self.non_negative) not in (
                0, len(self.columns)):
            raise ValueError("mean, std, columns (and non_negative, if given) must have one entry per feature")
        if not all(np.isfinite(self.mean)) or not all(s > 0 and np.isfinite(s) for s in self.std):
            raise ValueError("mean must be finite and std finite and positive")
        return self


BATCH_AXIS = "batch"  # the bundle's dynamic first axis (export.onnx): one window at a time here


class OnnxServing:
    """A bundle loaded into an ONNX Runtime session (one thread, batch 1). The batch axis is fixed
    to 1 for ONNX Runtime, so its graph optimizer folds the shape arithmetic of the dynamic axis
    away: ~30% less time per forecast on the default model (bench/gateway.py)."""

    def __init__(self, folder: Path):
        import onnxruntime

        folder = Path(folder)
        raw = (folder / INFO_FILE).read_bytes()
        if len(raw) > MAX_INFO_BYTES:
            raise ValueError(f"{folder / INFO_FILE}: {len(raw)} bytes, over {MAX_INFO_BYTES}")
        self.info = BundleInfo.model_validate_json(raw)
        model = (folder / MODEL_FILE).read_bytes()
        if hashlib.sha256(model).hexdigest() != self.info.onnx_sha256:
            raise ValueError(f"{folder / MODEL_FILE} does not match the sha256 in {INFO_FILE}")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.add_free_dimension_override_by_name(BATCH_AXIS, 1)
        self.session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        self.path = folder / MODEL_FILE

    def forecast(self, times_ns: np.ndarray, values: np.ndarray, issued_at: datetime | None = None) -> dict[str, Any]:
        """The forecast after a window of ``lookback`` rows (``values`` (L, F) in the data's units at
        ``times_ns``), as the JSON document a gateway publishes."""
        info = self.info
        if values.shape != (info.lookback, len(info.columns)) or len(times_ns) != info.lookback:
            raise ValueError(f"a window of {info.lookback} rows x {len(info.columns)} features is needed, "
                             f"got {values.shape}")
        mean, std = np.asarray(info.mean), np.asarray(info.std)
        x = ((values - mean) / std).astype(np.float32)[None]
        out = run_forecast(self.session, {"x": x, "marks": calendar_features(times_ns)[None]}, self.path)[0]
        scaled = floored(out * std[:, None] + mean[:, None] if info.levels else out * std + mean, info.non_negative)
        stamps = [int(times_ns[-1]) + info.step_ns * (h + 1) for h in range(info.horizon)]
        return {"client_id": info.client_id, "round": info.round, "model": info.model,
                "issued_at": iso(issued_at or datetime.now(timezone.utc)), "window_end": iso_ns(int(times_ns[-1])),
                "times": [iso_ns(t) for t in stamps], "levels": info.levels,
                "forecast": {column: _series(scaled[:, j], info.levels) for j, column in enumerate(info.columns)}}


def run_forecast(session: Any, feeds: dict[str, np.ndarray], path: Path) -> np.ndarray:
    """The graph's ``forecast`` for the windows ``feeds["x"]``, fed the inputs it reads (an anchor's
    graph reads no calendar). One forecast per window or an error naming ``path``: a graph that
    kept the batch it was exported with returns that many rows whatever it is given."""
    inputs = {i.name for i in session.get_inputs()}
    out = session.run(["forecast"], {name: array for name, array in feeds.items() if name in inputs})[0]
    if len(out) != len(feeds["x"]):
        raise ValueError(f"{path}: the model returned {len(out)} forecasts for {len(feeds['x'])} windows "
                         "(its graph fixed the batch it was exported with: export it again)")
    return out


def never_negative(history: np.ndarray) -> list[bool]:
    """Per column of ``history`` (rows, features; NaN where missing): True where no value is below 0."""
    with np.errstate(invalid="ignore"):
        return [bool(np.all(np.isnan(column) | (column >= 0))) for column in np.asarray(history, dtype=float).T]


def floored(values: np.ndarray, non_negative: list[bool]) -> np.ndarray:
    """``values`` (steps, features[, levels]) with the columns flagged ``non_negative`` floored at 0:
    a forecast of a quantity that has never been negative (irradiance, counts, wind speed) is not."""
    if not any(non_negative):
        return values
    floor = np.where(non_negative, 0.0, -np.inf).reshape((1, -1) + (1,) * (values.ndim - 2))
    return np.maximum(values, floor)


def _series(values: np.ndarray, levels: list[float]) -> dict[str, list[float]]:
    """One feature's forecast: ``value`` per step (a quantile model's median) and ``q<level>`` per level."""
    if not levels:
        return {"value": _rounded(values)}
    median = levels.index(0.5)
    return {"value": _rounded(values[:, median]),
            **{f"q{level:g}": _rounded(values[:, j]) for j, level in enumerate(levels) if level != 0.5}}


def _rounded(values: np.ndarray) -> list[float]:
    """Seven significant digits: float32's precision, no digits that mean nothing."""
    return [float(f"{v:.7g}") for v in values]


def document(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()
