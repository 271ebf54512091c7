"""The export matrix: every model the product trains (backbone x projection x head x point or
quantile forecasts), tiny, exported to ONNX and run in ONNX Runtime at several batch sizes
against torch on real weather windows; a spiking backbone's on-chip stack also to NIR and Lava
netx, each read back and simulated against the model. ``tests/test_export_matrix.py`` asserts on it and
``bench/export_matrix.py`` records it.

Each cell's model is the recipe's (``ModelConfig`` defaults, seasonal base included) at ``TINY``
sizes, trained a few steps (so no head is still zero) and its BatchNorm statistics taken from the
training windows (so spiking layers fire); ``export_onnx`` writes and verifies it on
``EXPORT_WINDOWS`` windows, a batch that none of ``BATCHES`` is and that no tiny size equals, so a
graph that kept a shape of it fails at every checked batch and shows in ``baked_shapes``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from pydantic import ValidationError

from edge_agent.data import TIME_FEATURES, ClientData, WindowSet, load_site, prepare_client
from edge_agent.models import BACKBONES, ModelConfig, build_forecaster
from edge_agent.models.backbones.spiking import SpikingBackbone
from edge_agent.models.forecaster import Forecaster
from edge_agent.problems import problem_lines
from edge_agent.train import calibrate_batchnorm, make_optimizer, train_epochs
from export.contract import ExportMismatchError
from export.onnx import (MAX_FLIPPED_SHARE, TOLERANCE, export_onnx, one_line, run_session, time_inference,
                         torch_outputs, verify)
from export.stack import UnsupportedLayerError

PROJECTIONS = ("channel", "qap", "linear")
HEADS = ("shared", "personal")
LEVELS: tuple[tuple[float, ...] | None, ...] = (None, (0.1, 0.5, 0.9))
TINY = {"lookback": 24, "horizon": 12, "d_qap": 4, "qap_heads": 2, "hidden": 4, "d_ff": 8, "heads": 2,
        "layers": 1, "steps": 2}
SITE = "amsterdam"  # bundled real weather, nine features
BATCHES = (1, 7, 32)
NEUROMORPHIC = ("nir", "lava")  # the formats of a spiking backbone's on-chip stack
EXPORT_WINDOWS = 11
TRAIN_STEPS, TRAIN_BATCH = 1, 4
CALIBRATION_WINDOWS = 16
SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Tile": 1}  # op -> its input that is a shape


@dataclass(frozen=True)
class Cell:
    """One model configuration of the matrix."""

    backbone: str
    projection: str
    head: str
    quantiles: tuple[float, ...] | None

    def config(self, sizes: dict[str, int] = TINY) -> ModelConfig:
        """The recipe's model with this cell's choices at ``sizes`` (``ValidationError`` where the
        config refuses the combination)."""
        return ModelConfig(backbone=self.backbone, projection=self.projection, head=self.head,
                           quantiles=self.quantiles, **sizes)

    def refusal(self, sizes: dict[str, int] = TINY) -> str | None:
        """Why the config refuses this cell at ``sizes``, in one line; None where it builds."""
        try:
            self.config(sizes)
        except ValidationError as err:
            return "; ".join(problem_lines(err, ModelConfig, lambda loc: ".".join(map(str, loc))))
        return None

    def row(self) -> dict[str, Any]:
        return {"backbone": self.backbone, "projection": self.projection, "head": self.head,
                "quantiles": list(self.quantiles) if self.quantiles else None}


def cells() -> list[Cell]:
    """Every backbone x projection x head x (point, quantiles), in that order."""
    return [Cell(*combination) for combination in itertools.product(sorted(BACKBONES), PROJECTIONS, HEADS, LEVELS)]


def matrix_data() -> ClientData:
    """The bundled weather site's windows at ``TINY``'s lookback and horizon."""
    return prepare_client(load_site(SITE), TINY["lookback"], TINY["horizon"], stride=TINY["lookback"])


def build(cell: Cell, data: ClientData, sizes: dict[str, int] = TINY, seed: int = 3) -> Forecaster:
    """The cell's model after ``TRAIN_STEPS`` training steps (so a seasonal base's head is no longer
    zero: the forecast depends on the backbone), BatchNorm statistics from the first
    ``CALIBRATION_WINDOWS`` training windows; in eval mode."""
    model = build_forecaster(cell.config(sizes), data.n_features, TIME_FEATURES, seed)
    train_epochs(model, data.train, 1, TRAIN_BATCH, make_optimizer(model, 1e-2), seed, max_steps=TRAIN_STEPS)
    with torch.no_grad():
        return calibrate_batchnorm(model, replace(data.train, starts=data.train.starts[:CALIBRATION_WINDOWS]))


def check(cell: Cell, data: ClientData, folder: Path, sizes: dict[str, int] = TINY,
          timed: bool = False) -> dict[str, Any]:
    """One cell at ``sizes`` (the lookback and horizon of ``data``'s windows): refused by the
    config or the exporter (``reason``, one line), or exported to ``folder`` and its
    ``model.onnx`` run at every batch of ``BATCHES`` against torch (figures of ``run_batches``),
    with any constant shaped by the export batch (``baked``) and, ``timed``, torch's time over
    ONNX Runtime's at batch 1."""
    row = {**cell.row(), "exported": False}
    reason = cell.refusal(sizes)
    if reason:
        return {**row, "reason": reason}
    model = build(cell, data, sizes)
    try:
        export_onnx(model, folder, data.test, EXPORT_WINDOWS, timed=False)
    except (UnsupportedLayerError, ExportMismatchError) as err:
        return {**row, "reason": one_line(err)}
    path = folder / "model.onnx"
    row.update(exported=True, **run_batches(model, path, data.test),
               baked=[name for graph in sorted(folder.glob("*.onnx"))
                      for name in baked_shapes(graph, {EXPORT_WINDOWS, EXPORT_WINDOWS * data.n_features})])
    row["ort_speedup_batch1"] = speedup(model, path, data.test) if timed else None
    if isinstance(model.shared["backbone"], SpikingBackbone):
        row["neuromorphic"] = neuromorphic(model, folder, data.test)
    return row


def neuromorphic(model: Forecaster, folder: Path, windows: WindowSet) -> dict[str, str]:
    """A spiking cell's on-chip stack to NIR and Lava netx, each read back and simulated against
    the model on ``EXPORT_WINDOWS`` windows: "exported", or the one-line reason it was refused."""
    from export import exporter

    out = {}
    for fmt in NEUROMORPHIC:
        try:
            exporter(fmt)(model, folder / f"model.{fmt}", windows, EXPORT_WINDOWS)
            out[fmt] = "exported"
        except (UnsupportedLayerError, ExportMismatchError) as err:
            out[fmt] = one_line(err)
    return out


def run_batches(model: Forecaster, path: Path, windows: WindowSet) -> dict[str, Any]:
    """``path`` in ONNX Runtime on the first windows of ``windows`` at every batch of ``BATCHES``
    against torch: the largest forecast difference, whether every spike is identical and the
    backbone's output firing rate (None without spikes), and whether every batch passed the
    export's own check (``export.onnx.verify``: a spike flipped at a float32 threshold tie is
    allowed in a few windows; ``batch_failure``: why the first that did not)."""
    worst, identical, rates, failures = 0.0, [], [], []
    for batch in BATCHES:
        x, marks, _ = windows.batch(torch.arange(batch))
        expected = torch_outputs(model, x.float(), marks.float())
        try:
            got = run_session(path, {"x": x.float().numpy(), "marks": marks.float().numpy()})
            worst = max(worst, _difference(expected[0], got[0]))
            identical += [bool(np.array_equal(expected[1], got[1]))] if len(got) > 1 else []
            rates += [float(expected[1].mean())] if len(got) > 1 else []
            verify(expected, got, TOLERANCE, MAX_FLIPPED_SHARE, f"{path.name} at batch {batch}")
        except ExportMismatchError as err:
            failures.append(one_line(err))
    return {"max_abs_diff": worst, "spikes_identical": all(identical) if identical else None,
            "firing_rate": float(np.mean(rates)) if rates else None, "batch_sizes_ok": not failures,
            **({"batch_failure": failures[0]} if failures else {})}


def _difference(expected: np.ndarray, got: np.ndarray) -> float:
    """Largest absolute difference; infinite where the shapes differ (a graph that kept its batch)."""
    return float(np.abs(expected - got).max()) if expected.shape == got.shape else float("inf")


def baked_shapes(path: Path, sizes: set[int]) -> list[str]:
    """Constants and initializers of the graph at ``path`` shaped by one of ``sizes`` (the export
    batch, or its sequences through a channel-independent backbone), or that give one of them as
    a shape to an op that builds or reshapes a tensor (``SHAPE_INPUTS``): a shape frozen at export,
    with which the graph fails or returns the wrong rows at any other batch. Each as ``file: name [dims]``."""
    graph = onnx.load(str(path)).graph
    shapes = {node.input[SHAPE_INPUTS[node.op_type]] for node in graph.node if node.op_type in SHAPE_INPUTS}
    tensors = {tensor.name: tensor for tensor in graph.initializer}
    tensors |= {node.output[0]: attribute.t for node in graph.node if node.op_type == "Constant"
                for attribute in node.attribute if attribute.name == "value"}
    return [f"{path.name}: {name} {list(tensor.dims)}" for name, tensor in tensors.items()
            if sizes & set(tensor.dims) or name in shapes and sizes & set(onnx.numpy_helper.to_array(tensor).ravel())]


def speedup(model: Forecaster, path: Path, windows: WindowSet) -> float:
    """Torch's median time over ONNX Runtime's for one window (``export.onnx.time_inference``)."""
    x, marks, _ = windows.batch(torch.arange(1))
    timings = time_inference(model, path, x.float(), marks.float())
    return timings["torch_ms"] / timings["onnx_ms"]
