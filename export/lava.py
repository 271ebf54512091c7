"""Lava netx HDF5 export of a spiking backbone's on-chip stack, verified by a fixed-point model.

lava-dl does not install on Python 3.11, so the file is written with h5py in the layout that
``lava.lib.dl.netx.hdf5.Network`` reads (lava-dl ``src/lava/lib/dl/netx/hdf5.py`` and
``utils.py::NetDict``; slayer's ``block/base.py::export_hdf5`` writes the same layout):

    layer/0: type=b"input" (S10, shape (1,)), shape=[d_in]                 no neuron: spikes go
    layer/i: type=b"dense", shape=[out], inFeatures, outFeatures,          straight to layer 1
             weight (out, in) int16 in [-256, 254], bias (out,) int16 in [-4096, 4095],
             neuron/{type=b"CUBA", iDecay, vDecay, vThMant, refDelay, gradedSpike}
             attrs: name (the torch module), scale (see below)
    simulation/{Ts=1, tSample=T};  root attrs: off_chip (what stays on the gateway's CPU)

Units: netx feeds ``weight`` to a Dense synapse, ``bias`` as ``bias_mant`` with ``bias_exp=6`` and
``vThMant`` as ``vth``; Lava's LIF shifts synaptic input and threshold left by 6 bits. So an
integer network equals the float layer ``w = weight/64``, ``b = bias/64``, ``threshold = vThMant/64``
in units of 1/4096 of voltage. Because a reset-to-zero LIF layer spikes identically when its
weights, bias and threshold are all multiplied by one ``scale > 0``, every layer gets its own scale:
the largest that keeps weights, bias, threshold and the 24-bit voltage in range (most precision).

On Lava: ``Network(net_config=path, reset_interval=T, reset_offset=1)`` with each position's T
input spike steps fed back to back. Each Dense synapse delays by one step, so dense layer i
(1-based) answers input step t at 0-based run step t + i (measured in Lava, ``export.lava_check``);
netx resets layer i's state exactly before its first input, which removes the bias-only steps the
delay would add.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from edge_agent.data import WindowSet
from edge_agent.models import Forecaster
from export.contract import ExportMismatchError, ExportReport, sample_windows, verified_write
from export.lava_check import lava_python, run_in_lava
from export.stack import DenseLIF, SpikingStack, spiking_stack

UNIT = 64  # Lava's 6-bit MSB alignment of synaptic input, bias (bias_exp=6) and threshold
DECAY_UNITY = 4096  # decays are 12-bit fractions
WEIGHT_RANGE = (-256, 254)  # netx 8-bit weights (lava-dl netx/utils.py::optimize_weight_bits)
BIAS_RANGE = (-4096, 4095)  # 13-bit signed bias mantissa (lava proc/lif/models.py)
VTH_MAX = 2**17 - 1  # 17-bit unsigned threshold mantissa
V_MAX = 2**23  # 24-bit signed current and voltage


@dataclass(frozen=True)
class Quantized:
    """One DenseLIF layer as netx integers, ``scale`` times the float layer."""

    name: str
    weight: np.ndarray  # int16 (out, in)
    bias: np.ndarray  # int16 (out,)
    v_th_mant: int
    v_decay: int
    scale: float
    clipped_weights: int
    clipped_biases: int


def quantize(layer: DenseLIF, scale: float | None = None) -> Quantized:
    """Round ``64 * scale * (w, b, threshold)`` to netx integers, clipping to their ranges.

    ``scale=None`` picks the largest scale with nothing clipped and the voltage bound
    ``(sum|w| + |b|) / (1 - beta)`` inside 24 bits; a given scale may clip (counted).
    """
    if scale is None:
        v_bound = (np.abs(layer.weight).sum(1) + np.abs(layer.bias)).max() / (1 - layer.beta)
        per_unit = [  # integers per float unit that each range allows; voltage is 64 x that
            WEIGHT_RANGE[1] / max(np.abs(layer.weight).max(), 1e-12), BIAS_RANGE[1] / max(np.abs(layer.bias).max(), 1e-12),
            VTH_MAX / layer.threshold, (V_MAX - 1) / (UNIT * v_bound),
        ]
        scale = float(min(per_unit)) / UNIT
    weight = np.round(layer.weight * UNIT * scale)
    bias = np.round(layer.bias * UNIT * scale)
    return Quantized(
        name=layer.name,
        weight=np.clip(weight, *WEIGHT_RANGE).astype(np.int16),
        bias=np.clip(bias, *BIAS_RANGE).astype(np.int16),
        v_th_mant=int(np.clip(round(layer.threshold * UNIT * scale), 1, VTH_MAX)),
        v_decay=round((1 - layer.beta) * DECAY_UNITY),
        scale=scale,
        clipped_weights=int(((weight < WEIGHT_RANGE[0]) | (weight > WEIGHT_RANGE[1])).sum()),
        clipped_biases=int(((bias < BIAS_RANGE[0]) | (bias > BIAS_RANGE[1])).sum()),
    )


def quantized_stack(stack: SpikingStack, scale: float | None = None) -> SpikingStack:
    """The float reference with exactly the exported integers: each layer ``scale`` times the
    original (same spikes), in steps of 1/64 so that float64 holds every voltage exactly and a
    voltage equal to the threshold stays equal, as on the chip (dividing by ``scale`` would not).
    """
    layers = []
    for layer in stack.layers:
        q = quantize(layer, scale)
        beta = 1 - q.v_decay / DECAY_UNITY
        layers.append(DenseLIF(layer.name, q.weight / UNIT, q.bias / UNIT, beta, q.v_th_mant / UNIT, layer.modules))
    return SpikingStack(stack.input_size, layers, list(stack.off_chip))


def _ascii(text: str) -> np.ndarray:
    """A string the way slayer writes ``type`` and NetDict decodes it: (1,) fixed-length ASCII."""
    return np.array([text.encode("ascii")], dtype="S10")


def write_netx(stack: SpikingStack, path: str | Path, steps: int, scale: float | None = None) -> list[Quantized]:
    """Write ``stack`` as a netx HDF5 file (layout in the module docstring); returns the integers."""
    quantized = [quantize(layer, scale) for layer in stack.layers]
    with h5py.File(path, "w") as f:
        f.attrs["off_chip"] = list(stack.off_chip)
        f["simulation/Ts"], f["simulation/tSample"] = np.int64(1), np.int64(steps)
        f["layer/0/type"], f["layer/0/shape"] = _ascii("input"), np.array([stack.input_size], dtype=np.int64)
        for index, q in enumerate(quantized, start=1):
            group = f.create_group(f"layer/{index}")
            group.attrs["name"], group.attrs["scale"] = q.name, q.scale
            group["type"], group["shape"] = _ascii("dense"), np.array([q.weight.shape[0]], dtype=np.int64)
            group["inFeatures"], group["outFeatures"] = np.int64(q.weight.shape[1]), np.int64(q.weight.shape[0])
            group["weight"], group["bias"] = q.weight, q.bias
            neuron = group.create_group("neuron")
            neuron["type"] = _ascii("CUBA")
            neuron["iDecay"], neuron["vDecay"] = np.int64(DECAY_UNITY), np.int64(q.v_decay)
            neuron["vThMant"], neuron["refDelay"] = np.int64(q.v_th_mant), np.int64(1)
            neuron["gradedSpike"] = np.bool_(False)
    return quantized


def _read(group: h5py.Group) -> dict:
    out: dict = {}
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            out[key] = _read(item)
        elif item.dtype.kind == "S" or h5py.check_string_dtype(item.dtype):  # as NetDict reads 'type'
            value = item[0] if item.shape else item[()]
            out[key] = value.decode("ascii") if isinstance(value, bytes) else value
        else:
            out[key] = item[()]
    if group.attrs:
        out["attrs"] = dict(group.attrs)
    return out


def read_netx(path: str | Path) -> dict:
    """Every dataset and attribute of a netx file; ``layer`` becomes a list in layer order."""
    with h5py.File(path, "r") as f:
        netx = _read(f)
    netx["layer"] = [netx["layer"][str(i)] for i in range(len(netx["layer"]))]
    return netx


def _decay(state: np.ndarray, decay: int) -> np.ndarray:
    """``state * (4096 - decay) / 4096`` truncated toward zero, as Lava's fixed-point LIF does."""
    product = state * (DECAY_UNITY - decay)
    return np.sign(product) * (np.abs(product) >> 12)


def cuba_dense(layer: dict, spikes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One netx dense layer under Lava's bit-accurate CUBA LIF: (T, N, in) -> spikes, u, v (T, N, out).

    Learned from lava ``src/lava/proc/lif/models.py`` (AbstractPyLifModelFixed, PyLifModelBitAcc),
    ``src/lava/proc/dense/models.py`` (PyDenseModelBitAcc) and lava-dl ``netx/hdf5.py``, per step:

        a = sum of weight[:, j] over input spikes j        (Dense; netx's weight_exp shift is exact)
        u = trunc(u * (4096 - iDecay) / 4096) + (a << 6)    netx du = iDecay - 1, Lava adds 1 back;
                                                            wraps modulo 2**24 (24-bit register)
        v = trunc(v * (4096 - vDecay) / 4096) + u + (bias << 6), clipped to +-(2**23 - 1)
        s = v > (vThMant << 6);  v = 0 where s               (reset to zero; refDelay is not modelled
                                                            by Lava's Python models either)
    Time is aligned to the float model (the Dense synapse's one-step delay is absorbed by netx's
    reset offsets, see the module docstring).
    """
    neuron = layer["neuron"]
    weight = layer["weight"].astype(np.int64).T
    bias = layer.get("bias", np.zeros(weight.shape[1])).astype(np.int64) << 6
    i_decay, v_decay, v_th = int(neuron["iDecay"]), int(neuron["vDecay"]), int(neuron["vThMant"]) << 6
    shape = spikes.shape[:2] + (weight.shape[1],)
    s_out, u_out, v_out = np.zeros(shape, bool), np.zeros(shape, np.int64), np.zeros(shape, np.int64)
    u, v = np.zeros(shape[1:], np.int64), np.zeros(shape[1:], np.int64)
    for t in range(spikes.shape[0]):
        u = _decay(u, i_decay) + ((spikes[t].astype(np.int64) @ weight) << 6)
        u = np.where(u > V_MAX, u - 2 * V_MAX, u)
        u = np.where(u <= -V_MAX, u + 2 * V_MAX, u)
        v = np.clip(_decay(v, v_decay) + u + bias, 1 - V_MAX, V_MAX - 1)
        s_out[t] = v > v_th
        v = np.where(s_out[t], 0, v)
        u_out[t], v_out[t] = u, v
    return s_out, u_out, v_out


def simulate_cuba(netx: dict, spikes: np.ndarray) -> list[np.ndarray]:
    """Run a netx dict (``read_netx``) on input spikes (T, N, in); every layer's spikes (T, N, out)."""
    outputs, x = [], spikes
    for index, layer in enumerate(netx["layer"]):
        if layer["type"] == "input":
            if tuple(layer["shape"]) != spikes.shape[2:]:
                raise ValueError(f"layer/{index}: input shape {tuple(layer['shape'])}, spikes {spikes.shape}")
        elif layer["type"] == "dense":
            x = cuba_dense(layer, x)[0]
            outputs.append(x)
        else:
            raise ValueError(f"layer/{index}: type {layer['type']!r} is not simulated (input and dense only)")
    return outputs


def chip_input(model: Forecaster, stack: SpikingStack, x: torch.Tensor, marks: torch.Tensor) -> np.ndarray:
    """The spikes that reach the stack's first layer for windows (B, L, F), from the forecaster's
    own path (alignment, instance norm, encoder), as the chip's input (T, B * positions, inputs)."""
    captured: list[torch.Tensor] = []
    first = model.get_submodule(stack.layers[0].name)
    hook = first.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        with torch.no_grad():
            model(x, marks)
    finally:
        hook.remove()
    return captured[0].flatten(1, -2).numpy()


def export_lava(model: Forecaster, out: Path, windows: WindowSet, n_windows: int = 64, *,
                min_agreement: float = 0.99, lava_venv: Path | None = None, lava_windows: int = 8) -> ExportReport:
    """Write the on-chip stack of ``model`` to file ``out`` and check it on ``n_windows`` real windows.

    The file is read back and run by ``simulate_cuba``; in every layer its spikes must equal those
    of the float model with the same integers in at least ``min_agreement`` of all (step,
    position, neuron) entries (``spike_agreement`` is the lowest layer's), or ``ExportMismatchError``
    names the layer and ``out`` keeps whatever it held before. Agreement with the unquantized model
    is the cost of 8-bit weights, reported per layer, not checked (measured 0.96-0.9996 per layer on
    weather windows). Every integer read back from the file must equal the one verified. Details:
    ``clipped_weights``, ``off_chip``. With ``lava_venv`` (built by ``make lava-venv``) Lava itself
    runs the file on the first ``lava_windows`` windows and every spike must equal the fixed-point
    model's (else the file is removed).
    """
    stack = spiking_stack(model.eval().shared["backbone"])  # UnsupportedLayerError names the layer
    if lava_venv is not None:
        lava_python(lava_venv)  # a missing Lava venv fails before anything is written
    x, marks = sample_windows(windows, n_windows)
    spikes = chip_input(model, stack, x, marks)
    path = Path(out)
    with verified_write(path) as partial:
        quantized = write_netx(stack, partial, steps=spikes.shape[0])
        written = read_netx(partial)
        check_integers(written, quantized, path)
        chip = simulate_cuba(written, spikes)
        agree_q = agreement(chip, quantized_stack(stack).run(spikes))
        check_agreement(stack, agree_q, min_agreement, path)
    agree_f = agreement(chip, stack.run(spikes))
    report = ExportReport(
        "lava", [str(path)], len(x), min(agree_q), steps=spikes.shape[0],
        layers=[layer_report(*row) for row in zip(quantized, stack.layers, agree_q, agree_f)],
        firing_rates={layer.name: float(s.mean()) for layer, s in zip(stack.layers, chip)},
        details={"clipped_weights": sum(q.clipped_weights for q in quantized), "off_chip": list(stack.off_chip)},
    )
    positions = lava_windows * spikes.shape[1] // len(x)  # the first windows' positions
    check_in_lava(report, path, spikes[:, :positions], [s[:, :positions] for s in chip], lava_venv)
    return report


def agreement(chip: list[np.ndarray], reference: list[np.ndarray]) -> list[float]:
    """Per layer, the fraction of (step, position, neuron) entries where both runs spike alike."""
    return [float((a == b).mean()) for a, b in zip(chip, reference)]


def check_integers(netx: dict, quantized: list[Quantized], path: Path) -> None:
    """Raise ``ExportMismatchError`` unless every integer of the file read back equals the one
    quantized and verified: a threshold off by one mantissa step is refused, however few spikes
    it would change on the windows checked."""
    if len(netx["layer"]) - 1 != len(quantized):
        raise ExportMismatchError(f"the netx file holds {len(netx['layer']) - 1} dense layers, the stack "
                                  f"{len(quantized)}; {path} not written")
    for layer, q in zip(netx["layer"][1:], quantized):
        fields = {"weight": (layer["weight"], q.weight), "bias": (layer["bias"], q.bias),
                  "vThMant": (layer["neuron"]["vThMant"], q.v_th_mant), "vDecay": (layer["neuron"]["vDecay"], q.v_decay)}
        for name, (read, intended) in fields.items():
            if np.shape(read) != np.shape(intended) or not np.array_equal(read, intended):
                raise ExportMismatchError(f"{q.name}: the netx file's fixed-point {name} reads back other than the "
                                          f"quantized layer's; {path} not written")


def check_agreement(stack: SpikingStack, agree_q: list[float], min_agreement: float, path: Path) -> None:
    """Raise ``ExportMismatchError`` at the first layer whose agreement with the quantized float
    model is below ``min_agreement``."""
    for layer, fraction in zip(stack.layers, agree_q):
        if fraction < min_agreement:
            raise ExportMismatchError(
                f"{layer.name}: the netx file's fixed-point spikes agree with the quantized model in only "
                f"{fraction:.4%} of entries (min_agreement {min_agreement:.2%}); {path} not written"
            )


def layer_report(q: Quantized, layer: DenseLIF, agree_q: float, agree_f: float) -> dict[str, Any]:
    """One layer's integers and agreement with the quantized and with the float model, for ``ExportReport.layers``."""
    return {
        "name": q.name, "inputs": q.weight.shape[1], "outputs": q.weight.shape[0], "scale": q.scale,
        "v_th_mant": q.v_th_mant, "clipped_biases": q.clipped_biases,
        "weight_max_error": float(np.abs(q.weight / (UNIT * q.scale) - layer.weight).max()),
        "agreement_quantized": agree_q, "agreement_float": agree_f,
    }


def check_in_lava(report: ExportReport, path: Path, spikes: np.ndarray, ours: list[np.ndarray],
                  venv: Path | None) -> None:
    """Run the written file in Lava (``export.lava_check``) when ``venv`` is given and record per
    layer its agreement with ``simulate_cuba`` and both spike counts; else note that only the
    fixed-point model checked it. Both are Loihi's integer arithmetic, so every spike must be
    equal: any difference removes the file and raises ``ExportMismatchError``."""
    if venv is None:
        report.notes.append("checked by the fixed-point model; --verify-in-lava runs Lava itself (make lava-venv)")
        return
    check = run_in_lava(path, spikes, ours, venv)
    report.details.update(lava_agreement=check.agreement, lava_spikes=check.lava_spikes, our_spikes=check.our_spikes,
                          lava_positions=check.positions, lava_seconds=round(check.seconds, 1))
    if min(check.agreement) < 1.0 or check.lava_spikes != check.our_spikes:
        path.unlink(missing_ok=True)
        raise ExportMismatchError(f"Lava's own simulator differs from the fixed-point model: agreement per layer "
                                  f"{check.agreement}, spikes per layer {check.lava_spikes} (Lava) vs "
                                  f"{check.our_spikes} (ours); {path} removed")
