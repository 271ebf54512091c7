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

from edge_agent.learners import HeadLearner
from edge_agent.serving.onnx_serving import INFO_FILE, MODEL_FILE, BundleInfo
from edge_agent.storage import write_bytes_atomically
from export.onnx import export_onnx

VERIFY_WINDOWS = 16  # the latest test windows the export must reproduce


def write_bundle(learner: HeadLearner, client_id: str, round_index: int, step: pd.Timedelta,
                 folder: Path) -> BundleInfo:
    """Export what ``learner`` serves once ``round_index`` is announced into ``folder``: the model
    first, then ``serving.json`` naming its sha256, so a reader never pairs a new JSON with an
    old model (it refuses the other mix). Raises ``export.contract.ExportMismatchError`` when
    ONNX Runtime does not reproduce the model."""
    served, data = learner.serving_model(round_index), learner.data
    staging = Path(folder) / ".next"
    shutil.rmtree(staging, ignore_errors=True)
    report = export_onnx(served.model, staging, data.test, VERIFY_WINDOWS)
    model = (staging / MODEL_FILE).read_bytes()
    info = BundleInfo(client_id=client_id, round=round_index - 1, model=served.which, columns=list(data.columns),
                      mean=[float(v) for v in data.scaler.mean], std=[float(v) for v in data.scaler.std],
                      lookback=served.model.cfg.lookback, horizon=served.model.cfg.horizon, step_ns=step.value,
                      levels=list(served.model.levels or ()), onnx_sha256=hashlib.sha256(model).hexdigest(),
                      verified_max_error=float(report.max_abs_error or 0.0))
    os.replace(staging / MODEL_FILE, Path(folder) / MODEL_FILE)
    write_bytes_atomically(Path(folder) / INFO_FILE, info.model_dump_json(indent=1).encode())
    shutil.rmtree(staging, ignore_errors=True)
    return info
