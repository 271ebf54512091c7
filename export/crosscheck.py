"""Our operation counts next to NeuroBench's (``SynapticOperations``, ``ActivationSparsity``) on the
same windows, for a backbone's Linear and Conv layers (the layers both count).

NeuroBench (2.3.0) hooks every Linear/Conv and decides per call, from the values, whether it is
fed spikes (every input in {-1, 0, 1}: ACs) or not (MACs), then counts one operation per non-zero
input and non-zero weight. Where the two rules meet, the counts are equal: a Linear fed binary
spikes, and a Linear fed real values. They differ by design where (1) a residual sum of spike
tensors arrives (a 2 is two spikes arriving together: we count 2 ACs, NeuroBench calls the layer
a MAC layer and counts one operation), (2) a convolution is zero-padded (we count the padded
taps, NeuroBench's zero inputs cost nothing), and (3) work outside Linear/Conv modules (spiking
attention's spike-spike products, DLinear's moving average, a Transformer layer's fused attention)
which NeuroBench does not see. Both divide by the windows (one sample = one forecast window).
``neurobench`` is imported lazily: it is a test/bench tool, not a runtime dependency.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edge_agent.models import Forecaster
from edge_agent.models.backbones.spiking import LIF
from export.opcount import LayerOps, measure

CONNECTIONS = (nn.Linear, nn.Conv2d)  # the modules both counters hook, of those our backbones use


@dataclass
class LayerComparison:
    """One Linear/Conv layer, per window: our operation kind and count, NeuroBench's, and the
    count NeuroBench's rule gives on our records (non-zero inputs x fan-out for a spike-fed layer)."""

    name: str
    cost: str
    ops: float
    neurobench_cost: str
    neurobench_ops: float
    nonzero_ops: float | None  # our active_inputs x fan-out; None for a MAC layer
    max_input: float


@dataclass
class Comparison:
    """A backbone on the same windows: per layer, and activation sparsity over its LIF layers."""

    backbone: str
    windows: int
    layers: list[LayerComparison]
    sparsity: float  # ours: 1 - spikes / neuron updates
    neurobench_sparsity: float
    neurobench_macs: float  # SynapticOperations' Effective_MACs / Effective_ACs (per window)
    neurobench_acs: float
    unseen_ops: float  # our backbone operations in modules NeuroBench does not hook, per window


def compare(model: Forecaster, x: torch.Tensor, marks: torch.Tensor) -> Comparison:
    """Count ``model``'s backbone on windows ``x`` with our counter and with NeuroBench."""
    from neurobench.metrics.utils.layers import single_layer_MACs
    from neurobench.metrics.workload import ActivationSparsity, SynapticOperations
    from neurobench.models import TorchModel

    backbone = model.eval().shared["backbone"]
    seen: list[torch.Tensor] = []
    hook = backbone.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        ours = {layer.name: layer for layer in measure(model, lambda: model(x, marks))}
    finally:
        hook.remove()
    bench = TorchModel(backbone)
    bench.add_activation_module(LIF)
    bench.register_hooks()
    try:
        with torch.no_grad():
            preds = bench(seen[0])
            per_layer = {id(h.layer): (h.inputs[0][0], *single_layer_MACs(h.inputs[0][0], h.layer))
                         for h in bench.connection_hooks}
            synops = SynapticOperations()(bench, preds, (seen[0], None))
            sparsity = ActivationSparsity()(bench, preds, (seen[0], None))
    finally:
        bench.cleanup_hooks()
    windows = len(x)
    names = {id(module): f"shared.backbone.{name}" for name, module in backbone.named_modules()}
    layers = [_layer(ours[names[key]], *per_layer[key], windows)
              for key, module in ((id(m), m) for m in backbone.modules() if isinstance(m, CONNECTIONS))
              if names[key] in ours]
    counted = {layer.name for layer in layers}
    lif = [layer for layer in ours.values() if layer.stage == "backbone" and layer.cost == "neuron_update"]
    unseen = sum(layer.macs + layer.acs for layer in ours.values()
                 if layer.stage == "backbone" and layer.name not in counted) / windows
    return Comparison(
        model.cfg.backbone, windows, layers,
        1 - sum(layer.spikes for layer in lif) / max(sum(layer.neuron_updates for layer in lif), 1),
        float(sparsity), synops["Effective_MACs"], synops["Effective_ACs"], unseen,
    )


def _layer(ours: LayerOps, inputs: torch.Tensor, ops: torch.Tensor, spiking: bool, windows: int) -> LayerComparison:
    nonzero = ours.active_inputs * ours.fan_out / windows if ours.cost == "ac" else None
    return LayerComparison(ours.name, ours.cost, (ours.macs + ours.acs) / windows, "ac" if spiking else "mac",
                           float(ops) / windows, nonzero, float(inputs.abs().max()))
