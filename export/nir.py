"""NIR export of a spiking stack: build a graph of NIR primitives, write it, read it back, simulate it.

NIR (Pedersen et al., "Neuromorphic intermediate representation: a unified instruction set for
interoperable brain-inspired computing", Nat. Commun. 15, 8122, 2024; primitives as defined in
the ``nir`` 1.0.8 package) states neurons in continuous time. Its LIF is
``tau dv/dt = (v_leak - v) + r I``, a spike when ``v > v_threshold``, then ``v = v_reset``. One
forward-Euler step of length ``dt`` gives

    v_t = (1 - dt/tau) v_{t-1} + (dt/tau) v_leak + (dt r/tau) I_t,

which is our discrete LIF (``v_t = beta v_{t-1} + current_t``, reset to zero) exactly when
``tau = dt/(1 - beta)`` (beta = 0.5: tau = 2 dt), ``r = tau/dt`` (input gain dt r/tau = 1: the
model already carries the 1/tau input gain inside its weights), ``v_leak = 0``, ``v_reset = 0``
and ``v_threshold = threshold``. The Affine before it holds the BatchNorm-folded weight and bias
unchanged. snntorch's NIR bridge uses the same convention and dt (1e-4 s); by its source, its
importer maps such a LIF to ``Leaky(beta=0.5)`` with unit input gain. LIF, not CubaLIF: our neuron
has no synaptic current (CubaLIF with tau_syn = dt, w_in = 1 is equivalent, with one state more).
"""

from __future__ import annotations

import copy
import graphlib
from functools import reduce
from pathlib import Path

import nir
import numpy as np
import torch

from edge_agent.data import WindowSet
from edge_agent.models import Forecaster
from export.contract import ExportMismatchError, ExportReport, sample_windows, verified_write
from export.stack import SpikingStack, spiking_stack

DT = 1e-4  # seconds per step; with beta = 0.5 every Euler factor above is exact in binary floating point
SUPPORTED = (nir.Input, nir.Affine, nir.Linear, nir.LIF, nir.CubaLIF, nir.Output)


class UnsupportedNodeError(ValueError):
    """A node of a NIR file (ours or another tool's) that ``simulate_nir`` cannot run; the message
    names the node and its NIR type. Reading-side; a model NIR cannot express is ``UnsupportedLayerError``."""


def to_nir(stack: SpikingStack, dt: float = DT, steps: int | None = None, source: str = "") -> nir.NIRGraph:
    """The stack as ``input -> affine0 -> lif0 -> affine1 -> ... -> output`` (mapping: module docstring)."""
    nodes: dict[str, nir.NIRNode] = {"input": nir.Input(input_type=np.array([stack.input_size]))}
    edges, previous = [], "input"
    for index, layer in enumerate(stack.layers):
        size, tau = layer.bias.shape[0], dt / (1.0 - layer.beta)
        origin = {"source_layer": layer.name}
        nodes[f"affine{index}"] = nir.Affine(weight=layer.weight, bias=layer.bias, metadata=origin)
        nodes[f"lif{index}"] = nir.LIF(
            tau=np.full(size, tau), r=np.full(size, tau / dt), v_leak=np.zeros(size),
            v_threshold=np.full(size, layer.threshold), v_reset=np.zeros(size),
            metadata={**origin, "beta": layer.beta},
        )
        edges += [(previous, f"affine{index}"), (f"affine{index}", f"lif{index}")]
        previous = f"lif{index}"
    nodes["output"] = nir.Output(output_type=np.array([stack.layers[-1].bias.shape[0]]))
    edges.append((previous, "output"))
    metadata = {
        "dt": dt, "source": source, "producer": "edgefl export.nir", "off_chip": "; ".join(stack.off_chip),
        "neuron_mapping": "tau = dt/(1-beta), r = tau/dt, v_leak = 0, v_reset = 0 (forward Euler)",
        **({} if steps is None else {"steps": steps}),
    }
    return nir.NIRGraph(nodes=nodes, edges=edges, metadata=metadata)


def write_nir(
    stack: SpikingStack, path: str | Path, dt: float = DT, steps: int | None = None, source: str = ""
) -> nir.NIRGraph:
    """Write ``to_nir(stack, ...)`` to ``path`` in NIR's HDF5 format; returns the graph written."""
    graph = to_nir(stack, dt, steps, source)
    nir.write(path, graph)
    return graph


def read_nir(path: str | Path) -> nir.NIRGraph:
    """Read a NIR file, type-checking that every edge joins matching shapes."""
    return nir.read(path)


def simulate_nir(graph: nir.NIRGraph, spikes: np.ndarray, dt: float) -> dict[str, np.ndarray]:
    """Run ``graph`` on spikes (T, N, in) in forward-Euler steps of ``dt``; every node's output (T, N, ...).

    Independent of the stack: it reads only the graph's nodes, parameters and edges, in
    topological order. Several edges into one node add up; neurons start at rest (v = 0).
    """
    for name, node in graph.nodes.items():
        if not isinstance(node, SUPPORTED):
            raise UnsupportedNodeError(
                f"node '{name}': NIR type {type(node).__name__} is not supported by simulate_nir "
                f"(supported: {', '.join(kind.__name__ for kind in SUPPORTED)})"
            )
    sources: dict[str, list[str]] = {name: [] for name in graph.nodes}
    for source, target in graph.edges:
        if source not in sources or target not in sources:
            raise ValueError(f"edge {source} -> {target} names a node the graph does not have")
        sources[target].append(source)
    try:
        order = list(graphlib.TopologicalSorter(sources).static_order())
    except graphlib.CycleError as err:
        cycle = " -> ".join(err.args[1])
        raise ValueError(f"recurrent edges (cycle {cycle}) are not supported by simulate_nir") from err
    outputs: dict[str, np.ndarray] = {}
    for name in order:
        node = graph.nodes[name]
        if isinstance(node, nir.Input):
            shape = tuple(int(size) for size in node.input_type["input"])
            if spikes.shape[2:] != shape:
                raise ValueError(f"node '{name}' takes {shape} per step, got spikes of shape {spikes.shape}")
            outputs[name] = spikes.astype(np.float64)
        elif not sources[name]:
            raise ValueError(f"node '{name}' has no incoming edge")
        else:
            outputs[name] = _apply(node, reduce(np.add, (outputs[s] for s in sources[name])), dt)
    return outputs


def _apply(node: nir.NIRNode, x: np.ndarray, dt: float) -> np.ndarray:
    if isinstance(node, nir.Affine):
        return x @ node.weight.T + node.bias
    if isinstance(node, nir.Linear):
        return x @ node.weight.T
    if isinstance(node, nir.LIF):
        return _lif(x, node.tau, node.r, node.v_leak, node.v_threshold, node.v_reset, dt)
    if isinstance(node, nir.CubaLIF):
        # tau_syn dI/dt = -I + w_in S, Euler-stepped before the membrane (the current of step t drives v_t)
        decay, gain = 1.0 - dt / node.tau_syn, dt / node.tau_syn * node.w_in
        current, synapse = np.empty_like(x), np.zeros(x.shape[1:])
        for t in range(x.shape[0]):
            synapse = decay * synapse + gain * x[t]
            current[t] = synapse
        return _lif(current, node.tau_mem, node.r, node.v_leak, node.v_threshold, node.v_reset, dt)
    return x  # Output


def _lif(current: np.ndarray, tau: np.ndarray, r: np.ndarray, v_leak: np.ndarray,
         threshold: np.ndarray, reset: np.ndarray, dt: float) -> np.ndarray:
    """NIR's LIF, one Euler step per time step; a spike sets v to v_reset before the next step."""
    decay, leak, gain = 1.0 - dt / tau, dt / tau * v_leak, dt / tau * r
    v, fired, out = np.zeros(current.shape[1:]), np.zeros(current.shape[1:], bool), np.empty_like(current)
    for t in range(current.shape[0]):
        v = decay * np.where(fired, reset, v) + leak + gain * current[t]
        fired = v > threshold
        out[t] = fired
    return out


def model_spikes(model: Forecaster, x: torch.Tensor, marks: torch.Tensor) -> tuple[np.ndarray, list[np.ndarray]]:
    """The chip's input spikes (T, B * positions, inputs) and each on-chip layer's spikes from the
    model's own eval forward.

    Runs a float64 copy so that the check compares NIR semantics, not float32 rounding.
    """
    twin = copy.deepcopy(model).double().eval()
    layers = [twin.get_submodule(layer.name) for layer in spiking_stack(twin.shared["backbone"]).layers]
    inputs, captured = [], []
    layers[0].register_forward_pre_hook(lambda _module, args: inputs.append(args[0]))
    for module in layers:
        module.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    with torch.no_grad():
        twin(x.double(), marks.double())
    return inputs[0].flatten(1, -2).numpy(), [output.flatten(1, -2).numpy() for output in captured]


def export_nir(model: Forecaster, out: Path, windows: WindowSet, n_windows: int = 256) -> ExportReport:
    """Write the model's on-chip stack to file ``out`` and prove the file right before it lands there.

    The file is read back and simulated on the encoder spikes of ``n_windows`` real windows; unless
    every spike equals the model's own, ``ExportMismatchError`` is raised and ``out`` keeps whatever
    it held before. An unsupported backbone fails before anything is written. Details: ``dt`` and
    ``sequences`` (windows x positions, each run through the stack).
    """
    stack = spiking_stack(model.shared["backbone"])
    x, marks = sample_windows(windows, n_windows)
    spikes, reference = model_spikes(model, x, marks)
    path = Path(out)
    with verified_write(path) as partial:
        write_nir(stack, partial, steps=spikes.shape[0], source=f"edgefl Forecaster {model.cfg.model_dump_json()}")
        graph = read_nir(partial)
        simulated = simulate_nir(graph, spikes, float(graph.metadata["dt"]))
        agreement = check_spikes(stack, simulated, reference, path)
    lifs = [f"lif{index}" for index in range(len(stack.layers))]
    return ExportReport(
        "nir", [str(path)], len(x), agreement, steps=spikes.shape[0],
        layers=[{"name": layer.name, "nodes": [f"affine{i}", f"lif{i}"], "shape": list(layer.weight.shape)}
                for i, layer in enumerate(stack.layers)],
        firing_rates={name: float(simulated[name].mean()) for name in ["input", *lifs]},
        details={"dt": float(graph.metadata["dt"]), "sequences": spikes.shape[1], "off_chip": list(stack.off_chip)},
    )


def check_spikes(
    stack: SpikingStack, simulated: dict[str, np.ndarray], reference: list[np.ndarray], path: Path
) -> float:
    """Fraction of the model's layer spikes that the simulated file's LIF nodes reproduce; anything
    below 1 raises ``ExportMismatchError`` naming the first layer that differs and how many spikes do."""
    differ = [int((simulated[f"lif{index}"] != expected).sum()) for index, expected in enumerate(reference)]
    total = sum(expected.size for expected in reference)
    if any(differ):
        first = stack.layers[next(index for index, count in enumerate(differ) if count)].name
        raise ExportMismatchError(
            f"{path}: NIR graph differs from the model in {sum(differ)} of {total} spikes, "
            f"first in {first}; not written"
        )
    return 1.0 - sum(differ) / total
