"""A client's whole forecaster (alignment, backbone, personal head) to ONNX, verified in ONNX Runtime.

Two layouts:
- ``model.onnx``: the unrolled graph, ``x`` (B, L, F) and ``marks`` (B, L, t) -> ``forecast``
  (B, H, F); a quantile model's ``forecast`` is every level, (B, H, F, Q) ordered like the levels,
  which the graph's metadata names (``quantiles``, e.g. "0.1,0.5,0.9"; ``label_levels``), so a
  gateway can take the median and the interval from one run; spiking backbones also output
  ``spikes``, the backbone's output spikes over the T steps (in spiking transformers residual sums
  of spikes, so small counts).
- streaming (spiking backbones): ``encode.onnx`` (x, marks -> encoder currents (T, ...), window
  mean and std), ``step.onnx`` (one step's current + every LIF's membrane and last spike ->
  that step's spikes + the new state) and ``readout.onnx`` (mean rate, mean, std -> forecast,
  every level for a quantile model).
  A gateway runs encode once, step T times and readout once; state lives in its memory.
Every export is run in ONNX Runtime on real windows and compared with torch (see ``export_onnx``
for the exact criteria), or ``ExportMismatchError`` is raised (the contract: ``export.contract``).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from torch import nn

from edge_agent.data import WindowSet
from edge_agent.models import Forecaster
from edge_agent.models.backbones.spiking import LIF, SpikingBackbone
from edge_agent.onnx_model import LEVELS_KEY
from export.contract import ExportMismatchError, ExportReport, sample_windows, verified_folder
from export.stack import UnsupportedLayerError

Run = Callable[[torch.Tensor, torch.Tensor], Sequence[np.ndarray]]
"""Windows (x, marks) -> a model's or a graph's outputs as arrays (forecast, then spikes if any)."""

BATCH = "batch"  # the windows axis of every graph's inputs and forecast
SEQUENCES = "sequences"  # what runs through a spiking backbone: a window, or each of its features (channel-independent)
ORT_FAILURES = (ort_state.Fail, ort_state.InvalidArgument, ort_state.RuntimeException)  # a graph that does not run
TOLERANCE = 1e-5
MAX_FLIPPED_SHARE = 0.05  # windows where float32 rounding at a threshold tie flipped a spike (at least one allowed)
OPSET = 17


def graph_forecast(model: Forecaster, representation: torch.Tensor, mean: torch.Tensor,
                   std: torch.Tensor) -> torch.Tensor:
    """What a graph's ``forecast`` holds after the backbone: the point forecast (B, H, F), or a
    quantile model's every level (B, H, F, Q), so an exported quantile model keeps its intervals."""
    if model.levels:
        return model.readout_quantiles(representation, mean, std)
    return model.readout(representation, mean, std)


def torch_forecast(model: Forecaster, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
    """The torch model's own output that ``forecast`` must reproduce (``forward`` or ``forward_quantiles``)."""
    return model.forward_quantiles(x, marks) if model.levels else model(x, marks)


def torch_outputs(model: Forecaster, x: torch.Tensor, marks: torch.Tensor) -> tuple[np.ndarray, ...]:
    """What ``model.onnx`` must output on (x, marks): ``torch_forecast``, and a spiking backbone's
    output spikes (T, sequences, ...)."""
    with torch.no_grad():
        if isinstance(model.shared["backbone"], SpikingBackbone):
            return tuple(o.numpy() for o in Unrolled(model)(x, marks))
        return (torch_forecast(model, x, marks).numpy(),)


class Unrolled(nn.Module):
    """The forecaster as one graph; spiking backbones also expose their output spikes."""

    def __init__(self, model: Forecaster):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, marks: torch.Tensor):
        backbone = self.model.shared["backbone"]
        z, mean, std = self.model.encode(x, marks)
        if not isinstance(backbone, SpikingBackbone):
            return graph_forecast(self.model, backbone(z), mean, std)
        spikes = backbone.spike_steps(backbone.encoder(z))
        return graph_forecast(self.model, backbone.readout(spikes.mean(0)), mean, std), spikes


class Encode(nn.Module):
    """Streaming part 1: normalization, QAP, time fusion and the encoder's currents."""

    def __init__(self, model: Forecaster):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, marks: torch.Tensor):
        z, mean, std = self.model.encode(x, marks)
        return self.model.shared["backbone"].encoder.currents(z), mean, std


class Step(nn.Module):
    """Streaming part 2: one time step of every LIF layer, state in and out as tensors."""

    def __init__(self, backbone: SpikingBackbone):
        super().__init__()
        self.backbone = backbone
        self.lifs = [m for m in backbone.modules() if isinstance(m, LIF)]

    def forward(self, current: torch.Tensor, *state: torch.Tensor):
        for index, lif in enumerate(self.lifs):
            lif.state = (state[2 * index], state[2 * index + 1])
        try:
            spikes = self.backbone.spike_steps(self.backbone.encoder.lif(current))
            new_state = [tensor for lif in self.lifs for tensor in lif.state]
        finally:
            for lif in self.lifs:
                lif.state = None
        return (spikes, *new_state)


class Readout(nn.Module):
    """Streaming part 3: mean rate -> backbone read-out -> personal head -> original scale."""

    def __init__(self, model: Forecaster):
        super().__init__()
        self.model = model

    def forward(self, rate: torch.Tensor, mean: torch.Tensor, std: torch.Tensor):
        return graph_forecast(self.model, self.model.shared["backbone"].readout(rate), mean, std)


def export_onnx(model: Forecaster, out: Path, windows: WindowSet, n_windows: int = 64, *,
                tolerance: float = TOLERANCE, max_flipped: float = MAX_FLIPPED_SHARE, timed: bool = True) -> ExportReport:
    """Write the unrolled graph (and the streaming graphs for spiking backbones) to folder ``out`` and verify them.

    A spike is a threshold test: a membrane within float32 rounding of its threshold may fire in
    one runtime and not in the other (summation order differs), and what follows then differs
    legitimately, and the flip travels on through the window's later layers and steps. So the
    number of windows with any differing spike is bounded (at most ``max_flipped`` of them, and
    at least one is allowed: a tie is a per-window event, while how far its flip travels depends
    on the depth; the report gives the spike agreement too), and on every window whose output spikes are identical
    the forecast must be within ``tolerance`` (the forecast depends on the output spikes only).
    ANN forecasts must be within ``tolerance`` everywhere. Every graph is checked at a second batch
    size too (``verify_batches``). The files land in ``out`` only when every check passed
    (``verified_folder``). Spiking details: ``spikes_checked``,
    ``flipped_windows`` (windows left out of the forecast check) and ``stream_max_abs_error``.
    ``timed``: also time torch against ONNX Runtime on the checked windows (``timings_ms``).
    """
    folder = Path(out)
    model = model.eval()
    x, marks = sample_windows(windows, n_windows)
    with verified_folder(folder) as scratch:
        report = _write_verified(model, scratch, x, marks, tolerance, max_flipped)
    report.files = [str(folder / Path(name).name) for name in report.files]  # where they landed
    if timed:
        report.timings_ms = time_inference(model, folder / "model.onnx", x, marks)
    if model.levels:
        report.notes.append(f"forecast: every quantile level {model.levels} on the last axis, (batch, H, F, "
                            f"{len(model.levels)}); the median is index {model.cfg.median_index}")
    return report


def _write_verified(model: Forecaster, folder: Path, x: torch.Tensor, marks: torch.Tensor, tolerance: float,
                    max_flipped: float) -> ExportReport:
    """``export_onnx``'s graphs written to ``folder`` and checked against torch on ``x``, ``marks``."""
    spiking = isinstance(model.shared["backbone"], SpikingBackbone)
    outputs = ["forecast", "spikes"] if spiking else ["forecast"]
    path = folder / "model.onnx"
    _export(Unrolled(model), (x, marks), path, ["x", "marks"], outputs, {"spikes": {1: SEQUENCES}})
    label_levels(path, model.levels)
    reference = functools.partial(torch_outputs, model)
    expected = reference(x, marks)

    def graph(x: torch.Tensor, marks: torch.Tensor) -> list[np.ndarray]:
        return run_session(path, {"x": x.numpy(), "marks": marks.numpy()})

    error, agreement, flipped = verify_batches(reference, graph, x, marks, expected, tolerance, max_flipped,
                                               "model.onnx")
    report = ExportReport("onnx", [str(path)], len(x), agreement, error)
    if spiking:
        stream_error = _export_streaming(model, folder, x, marks, reference, expected, tolerance, max_flipped)
        _add_streaming(report, folder, expected[1], flipped, stream_error)
    return report


def verify_batches(reference: Run, artefact: Run, x: torch.Tensor, marks: torch.Tensor, expected: Sequence[np.ndarray],
                   tolerance: float, max_flipped: float, what: str) -> tuple[float, float | None, int]:
    """``verify`` of ``artefact`` on the windows ``x``, ``marks`` against ``expected`` (``reference``'s
    outputs there; their figures are returned), and first at another batch size against
    ``reference``: the first window alone (twice when only one is given). A graph that kept a
    shape of its export batch fails there, so every graph's batch axis is dynamic for real, not
    only declared."""
    other = torch.zeros(2 if len(x) == 1 else 1, dtype=torch.long)
    verify(reference(x[other], marks[other]), artefact(x[other], marks[other]), tolerance, max_flipped,
           f"{what} at batch {len(other)}")
    return verify(expected, artefact(x, marks), tolerance, max_flipped, what)


def label_levels(path: Path, levels: tuple[float, ...] | None) -> None:
    """Name a quantile model's levels in the graph's metadata (``LEVELS_KEY``); a point model's
    graph carries none."""
    if not levels:
        return
    graph = onnx.load(str(path))
    onnx.helper.set_model_props(graph, {LEVELS_KEY: ",".join(map(str, levels))})
    onnx.save(graph, str(path))


def _add_streaming(report: ExportReport, folder: Path, spikes: np.ndarray, flipped: int, stream_error: float) -> None:
    """A spiking backbone's extras: the streaming graphs' files and the spike figures of ``model.onnx``."""
    report.files += [str(folder / f"{name}.onnx") for name in ("encode", "step", "readout")]
    report.steps, report.firing_rates = int(spikes.shape[0]), {"spikes": float(spikes.mean())}
    report.details = {"spikes_checked": int(spikes.size), "flipped_windows": flipped,
                      "stream_max_abs_error": stream_error}
    report.notes.append("flipped_windows: windows with a spike flipped at a float32 threshold tie, "
                        "left out of the forecast check")


def verify(expected: tuple, got: list | tuple, tolerance: float, max_flipped: float,
           what: str) -> tuple[float, float | None, int]:
    """(max forecast error on windows with identical spikes, spike agreement, windows with a
    flipped spike); raises ``ExportMismatchError`` when more than ``max_flipped`` of the windows
    (at least one allowed) have a differing spike, or a window with identical spikes a forecast
    beyond ``tolerance``. Spikes are (T, sequences, ...) with each window's sequences together:
    one per window, or one per feature of a window for a channel-independent model."""
    if len(expected) == 1:
        return compare(expected, got, tolerance, what), None, 0
    want, have = expected[1], got[1]
    if want.shape != have.shape:
        raise ExportMismatchError(f"{what}: spikes have shape {have.shape}, torch gives {want.shape}")
    differ = want != have
    agreement = 1.0 - float(differ.mean())
    windows = expected[0].shape[0]  # a channel-independent model's spikes hold each window's features side by side
    same = ~differ.reshape(differ.shape[0], windows, -1).any(axis=(0, 2))
    allowed = max(1, int(max_flipped * same.size))
    if (~same).sum() > allowed:
        raise ExportMismatchError(f"{what}: {int((~same).sum())} of {same.size} windows have spikes that differ from "
                                  f"torch (at most {allowed} may, at a float32 threshold tie; {int(differ.sum())} of "
                                  f"{differ.size} spikes differ, agreement {agreement:.5f})")
    error = compare((expected[0][same],), (got[0][same],), tolerance, what)
    return error, agreement, int((~same).sum())


def _export_streaming(model: Forecaster, folder: Path, x: torch.Tensor, marks: torch.Tensor,
                      reference: Run, expected: Sequence[np.ndarray], tolerance: float, max_flipped: float) -> float:
    backbone = model.shared["backbone"]
    step = Step(backbone)
    with torch.no_grad():
        currents, mean, std = Encode(model)(x, marks)
    state = [torch.zeros(shape) for shape in state_shapes(backbone, currents) for _ in (0, 1)]
    names = [f"{kind}_{i}" for i in range(len(step.lifs)) for kind in ("membrane", "spike")]
    _export(Encode(model), (x, marks), folder / "encode.onnx", ["x", "marks"], ["currents", "mean", "std"],
            {"currents": {1: SEQUENCES}})
    inputs, outputs = ["current", *names], ["spikes", *[f"next_{n}" for n in names]]
    _export(step, (currents[0], *state), folder / "step.onnx", inputs, outputs,
            {name: {0: SEQUENCES} for name in inputs + outputs})
    rate = torch.from_numpy(expected[1]).mean(0)
    _export(Readout(model), (rate, mean, std), folder / "readout.onnx", ["rate", "mean", "std"], ["forecast"],
            {"rate": {0: SEQUENCES}})

    def streamed(x: torch.Tensor, marks: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        return stream(folder, x.numpy(), marks.numpy())

    return verify_batches(reference, streamed, x, marks, expected, tolerance, max_flipped, "streaming graphs")[0]


def stream(folder: Path, x: np.ndarray, marks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run the three streaming graphs as a gateway would: encode, T steps, readout."""
    encode, step, readout = (ort_session(folder / f"{n}.onnx") for n in ("encode", "step", "readout"))
    currents, mean, std = encode.run(None, {"x": x, "marks": marks})
    batch = currents.shape[1]
    state = {
        i.name: np.zeros([d if isinstance(d, int) else batch for d in i.shape], np.float32)
        for i in step.get_inputs()[1:]
    }
    spikes = []
    for current in currents:
        out = step.run(None, {"current": current, **state})
        spikes.append(out[0])
        state = dict(zip(state, out[1:]))
    rate = np.stack(spikes).mean(0)
    return readout.run(None, {"rate": rate, "mean": mean, "std": std})[0], np.stack(spikes)


def state_shapes(backbone: SpikingBackbone, currents: torch.Tensor) -> list[tuple[int, ...]]:
    """Every LIF layer's per-step input shape (module order), found by one unrolled pass with hooks."""
    lifs = [m for m in backbone.modules() if isinstance(m, LIF)]
    shapes: dict[int, tuple[int, ...]] = {}

    def record(module: nn.Module, args: tuple) -> None:
        shapes[id(module)] = tuple(args[0].shape[1:])

    hooks = [lif.register_forward_pre_hook(record) for lif in lifs]
    try:
        with torch.no_grad():
            backbone.spike_steps(backbone.encoder.lif(currents))
    finally:
        for hook in hooks:
            hook.remove()
    return [shapes[id(lif)] for lif in lifs]


def _export(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]] | None = None) -> None:
    """Legacy (tracing) exporter: it records the Python-side state handling of ``Step`` as plain
    graph inputs/outputs; every axis but the dynamic ones is fixed: axis 0 (``BATCH``) of every
    input and output unless ``axes`` names another (``SEQUENCES``). A model the exporter cannot
    record raises ``UnsupportedLayerError`` naming the file."""
    axes = {name: {0: BATCH} for name in inputs + outputs} | (axes or {})
    module.eval()  # the exporter restores the wrapper's mode afterwards, and with it its children's
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # the fused encoder-layer kernel has no ONNX op
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                              dynamic_axes=axes, opset_version=OPSET, dynamo=False)
    except torch.onnx.errors.OnnxExporterError as err:
        raise UnsupportedLayerError(f"{path.name}: {one_line(err)}") from None
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def ort_session(path: Path) -> ort.InferenceSession:
    """A CPU session on ``path`` that logs nothing: its failures reach the caller as exceptions."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_session(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Every output of ``path`` on ``feeds``; a graph ONNX Runtime cannot run raises
    ``ExportMismatchError`` naming the file, the batch and the node that failed."""
    try:
        return ort_session(path).run(None, feeds)
    except ORT_FAILURES as err:
        batch = len(next(iter(feeds.values())))
        raise ExportMismatchError(f"{path.name} fails in ONNX Runtime at batch {batch}: {one_line(err)}") from None


def one_line(err: Exception) -> str:
    """An exception's message on one line (ONNX Runtime's and torch's span several)."""
    return " ".join(str(err).split())


def compare(expected: tuple, got: list | tuple, tolerance: float, what: str) -> float:
    """Largest absolute difference; raises when it exceeds ``tolerance`` (0 means exact, for spikes)."""
    worst = 0.0
    for index, (want, have) in enumerate(zip(expected, got)):
        want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
        if want.shape != have.shape:
            raise ExportMismatchError(f"{what}: output {index} has shape {have.shape}, torch gives {want.shape}")
        error = float(np.abs(want - have).max()) if want.size else 0.0
        if error > tolerance:
            differ = int((np.abs(want - have) > tolerance).sum())
            raise ExportMismatchError(
                f"{what}: output {index} differs from torch by up to {error:.3g} "
                f"({differ} of {want.size} values beyond {tolerance:g})"
            )
        worst = max(worst, error)
    return worst


def time_inference(model: Forecaster, path: Path, x: torch.Tensor, marks: torch.Tensor,
                   repeats: int = 20) -> dict[str, float]:
    """Median milliseconds per batch: torch eager vs ONNX Runtime on the same windows."""
    session = ort_session(path)
    feeds = {"x": x.numpy(), "marks": marks.numpy()}

    def median(run) -> float:
        run()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1000)
        return float(np.median(times))

    with torch.no_grad():
        torch_ms = median(lambda: torch_forecast(model, x, marks))
    onnx_ms = median(lambda: session.run(None, feeds))
    return {"torch_ms": torch_ms, "onnx_ms": onnx_ms}
