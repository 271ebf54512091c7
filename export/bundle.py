"""The agent's side of serving: after every accepted round, the model it serves exported to ONNX,
verified against torch on its latest windows (``export.onnx``), and written with what a
torch-free server needs to use it (``serving.json``, see ``edge_agent.serving.onnx_serving.BundleInfo``).
The agent gets this function from the CLI (``edgefl agent run``): edge_agent does not import export."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from edge_agent.data import ClientData
from edge_agent.learners import HeadLearner
from edge_agent.models import Forecaster
from edge_agent.models.backbones.spiking import SpikingBackbone
from edge_agent.models.combination import MeanForecaster, MedianForecaster
from edge_agent.selection import MEAN_OF_BEST, MEDIAN, Served, fits_window, lookback_anchor
from edge_agent.serving.onnx_serving import INFO_FILE, MODEL_FILE, BundleInfo, never_negative
from edge_agent.storage import write_bytes_atomically
from export.contract import ExportReport
from export.contract import sample_windows
from export.onnx import TOLERANCE, _export, export_onnx, ort_session, run_session, verify_batches
from export.silence import SilentLayersError, lif_rates, silence_line, silent_layers

VERIFY_WINDOWS = 16  # the latest test windows the export must reproduce


def write_bundle(learner: HeadLearner, client_id: str, round_index: int, step_ns: int,
                 folder: Path) -> BundleInfo:
    """Export what ``learner`` serves once ``round_index`` is announced into ``folder``: the model
    first, then ``serving.json`` naming its sha256, so a reader never pairs a new JSON with an
    old model (it refuses the other mix). An anchor that needs only the lookback window (the
    seasonal rules) is exported as a graph too; one that needs the whole history (ETS, Theta,
    MSTL) cannot be served from a window, so the bundle holds the best candidate that can; so does
    the median of the candidates (``edge_agent.models.combination``), unless a spiking member's
    threshold tests make ONNX Runtime and torch disagree legitimately (then the best single one).
    Raises ``export.contract.ExportMismatchError`` when ONNX Runtime does not reproduce the model."""
    data = learner.data
    served = servable(learner, round_index)
    if served.model is not None and _spiking(served.model):
        refuse_silent(served.model, data, client_id)
    staging = Path(folder) / ".next"
    shutil.rmtree(staging, ignore_errors=True)
    if served.which in (MEDIAN, MEAN_OF_BEST):
        report = export_module(combined_module(served, data), staging, data)
    elif served.model is None:
        report = export_module(lookback_anchor(data, served.which), staging, data)
    else:
        report = export_onnx(served.model, staging, data.test, VERIFY_WINDOWS)
    model = (staging / MODEL_FILE).read_bytes()
    levels = () if served.model is None else served.model.levels or ()
    info = BundleInfo(client_id=client_id, round=round_index - 1, model=served.which, columns=list(data.columns),
                      mean=[float(v) for v in data.scaler.mean], std=[float(v) for v in data.scaler.std],
                      lookback=data.train.lookback, horizon=data.train.horizon, step_ns=step_ns,
                      levels=list(levels), onnx_sha256=hashlib.sha256(model).hexdigest(),
                      verified_max_error=float(report.max_abs_error or 0.0), non_negative=never_negative(data.raw))
    os.replace(staging / MODEL_FILE, Path(folder) / MODEL_FILE)
    write_bytes_atomically(Path(folder) / INFO_FILE, info.model_dump_json(indent=1).encode())
    shutil.rmtree(staging, ignore_errors=True)
    return info


def refuse_silent(model: Forecaster, data: ClientData, client_id: str) -> None:
    """The silence rule (``export.silence``) on the windows the bundle is verified on: a spiking
    model with a layer that never fires is not served (``SilentLayersError``)."""
    x, marks = sample_windows(data.test, VERIFY_WINDOWS)
    silent = silent_layers(lif_rates(model, x, marks))
    if silent:
        raise SilentLayersError(f"{client_id}: the served model's {silence_line(silent, len(x))}; not exported")


def servable(learner: HeadLearner, round_index: int) -> Served:
    """What ``learner`` serves, or where that needs more than the lookback window (ETS, Theta, MSTL,
    or a median with one of them), the best candidate among its models and the anchors computable
    from the window; a median with a spiking member is left out (its threshold tests may make ONNX
    Runtime and torch disagree legitimately)."""
    served, data = learner.serving_model(round_index), learner.data
    if _exportable(served, data):
        return served
    window = [a for a in learner.training.anchors if fits_window(a, data.val, data.period)]
    served = learner.serving_model(round_index, window)
    if _exportable(served, data):
        return served
    served = learner.serving_model(round_index, window, median=False)
    return served if _exportable(served, data) else learner.serving_model(round_index, window, median=False, combine=1)


def combined_module(served: Served, data: ClientData) -> torch.nn.Module:
    """The median of every candidate, or the mean of the picks (one may be that median), as one
    module over the lookback window (``edge_agent.models.combination``)."""
    def member(name: str, model: torch.nn.Module | None) -> torch.nn.Module:
        if name == MEDIAN:
            return MedianForecaster([member(n, m) for n, m in served.candidates.items()])
        return model or lookback_anchor(data, name)

    picks = served.picks or (served.which,)
    modules = [member(name, served.candidates.get(name)) for name in picks]
    return modules[0] if len(modules) == 1 else MeanForecaster(modules)


def _exportable(served: Served, data: ClientData) -> bool:
    """Whether what is served runs from the lookback window alone (and, combined, without a spiking member)."""
    def alone(name: str, model: torch.nn.Module | None) -> bool:
        return model is not None or fits_window(name, data.val, data.period)

    def combined(name: str, model: torch.nn.Module | None) -> bool:
        if name == MEDIAN:
            return all(combined(n, m) for n, m in served.candidates.items())
        return alone(name, model) and not (model is not None and _spiking(model))

    if served.which not in (MEDIAN, MEAN_OF_BEST):
        return alone(served.which, served.model)
    return all(combined(name, served.candidates.get(name)) for name in served.picks or (served.which,))


def _spiking(model: torch.nn.Module) -> bool:
    return isinstance(model, Forecaster) and isinstance(model.shared["backbone"], SpikingBackbone)


def export_module(module: torch.nn.Module, folder: Path, data: ClientData) -> ExportReport:
    """A module with a forecaster's interface that is not one forecaster (a lookback anchor, a
    median) as ``model.onnx`` (inputs x and, where it reads the calendar, marks; output forecast),
    checked against torch on the latest test windows and on the first alone (``verify_batches``)."""
    folder.mkdir(parents=True, exist_ok=True)
    x, marks = sample_windows(data.test, VERIFY_WINDOWS)
    path = folder / MODEL_FILE
    _export(module, (x, marks), path, ["x", "marks"], ["forecast"])
    inputs = {i.name for i in ort_session(path).get_inputs()}  # an anchor reads no calendar

    def reference(x: torch.Tensor, marks: torch.Tensor) -> tuple[np.ndarray]:
        with torch.no_grad():
            return (module.eval()(x, marks).numpy(),)

    def graph(x: torch.Tensor, marks: torch.Tensor) -> list[np.ndarray]:
        feeds = {"x": x.numpy(), "marks": marks.numpy()}
        return run_session(path, {name: value for name, value in feeds.items() if name in inputs})

    error = verify_batches(reference, graph, x, marks, reference(x, marks), TOLERANCE, 0.0, MODEL_FILE)[0]
    return ExportReport("onnx", [str(path)], len(x), None, error)
