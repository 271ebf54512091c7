"""The agent's side of serving: after every accepted round, the model it serves exported to ONNX,
verified against torch on its latest windows (``export.onnx``), and written with what a
torch-free server needs to use it (``serving.json``, see ``edge_agent.serving.onnx_serving.BundleInfo``).
The agent gets this function from the CLI (``edgefl agent run``): edge_agent does not import export."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pandas as pd

import torch

from edge_agent.anchors import lookback_rule
from edge_agent.data import ClientData
from edge_agent.learners import HeadLearner
from edge_agent.models.seasonal import LookbackAnchor
from edge_agent.selection import Served
from edge_agent.serving.onnx_serving import INFO_FILE, MODEL_FILE, BundleInfo
from edge_agent.storage import write_bytes_atomically
from export.contract import ExportReport
from export.contract import sample_windows
from export.onnx import _export, compare, export_onnx, run_session

VERIFY_WINDOWS = 16  # the latest test windows the export must reproduce


def write_bundle(learner: HeadLearner, client_id: str, round_index: int, step: pd.Timedelta,
                 folder: Path) -> BundleInfo:
    """Export what ``learner`` serves once ``round_index`` is announced into ``folder``: the model
    first, then ``serving.json`` naming its sha256, so a reader never pairs a new JSON with an
    old model (it refuses the other mix). An anchor that needs only the lookback window (the
    seasonal rules) is exported as a graph too; one that needs the whole history (ETS, Theta,
    MSTL) cannot be served from a window, so the bundle holds the best candidate that can.
    Raises ``export.contract.ExportMismatchError`` when ONNX Runtime does not reproduce the model."""
    data = learner.data
    served = servable(learner, round_index)
    staging = Path(folder) / ".next"
    shutil.rmtree(staging, ignore_errors=True)
    if served.model is None:
        module = LookbackAnchor(served.which, data.train.lookback, data.train.horizon, data.period)
        report = export_anchor(module, staging, data)
    else:
        report = export_onnx(served.model, staging, data.test, VERIFY_WINDOWS)
    model = (staging / MODEL_FILE).read_bytes()
    levels = () if served.model is None else served.model.levels or ()
    info = BundleInfo(client_id=client_id, round=round_index - 1, model=served.which, columns=list(data.columns),
                      mean=[float(v) for v in data.scaler.mean], std=[float(v) for v in data.scaler.std],
                      lookback=data.train.lookback, horizon=data.train.horizon, step_ns=step.value,
                      levels=list(levels), onnx_sha256=hashlib.sha256(model).hexdigest(),
                      verified_max_error=float(report.max_abs_error or 0.0))
    os.replace(staging / MODEL_FILE, Path(folder) / MODEL_FILE)
    write_bytes_atomically(Path(folder) / INFO_FILE, info.model_dump_json(indent=1).encode())
    shutil.rmtree(staging, ignore_errors=True)
    return info


def servable(learner: HeadLearner, round_index: int) -> Served:
    """What ``learner`` serves, or where that is an anchor needing the whole history, the best
    candidate among its models and the anchors computable from the lookback window."""
    served, data = learner.serving_model(round_index), learner.data
    if served.model is not None or _fits_window(served.which, data):
        return served
    return learner.serving_model(round_index, [a for a in learner.training.anchors if _fits_window(a, data)])


def _fits_window(anchor: str, data: ClientData) -> bool:
    try:
        lookback_rule(anchor, data.train.lookback, data.train.horizon, data.period)
    except ValueError:
        return False
    return True


def export_anchor(module: LookbackAnchor, folder: Path, data: ClientData) -> ExportReport:
    """A lookback anchor as ``model.onnx`` (inputs x, marks; output forecast), checked against torch
    on the latest test windows."""
    folder.mkdir(parents=True, exist_ok=True)
    x, marks = sample_windows(data.test, VERIFY_WINDOWS)
    _export(module, (x, marks), folder / MODEL_FILE, ["x", "marks"], ["forecast"])
    with torch.no_grad():
        expected = (module(x, marks).numpy(),)
    got = run_session(folder / MODEL_FILE, {"x": x.numpy()})  # the rule reads no calendar: the graph has no marks
    error = compare(expected, got, 1e-5, MODEL_FILE)
    return ExportReport("onnx", [str(folder / MODEL_FILE)], len(x), None, error)
