"""The part of a spiking backbone a neuromorphic chip can run: Dense + LIF layers, BatchNorm folded.

One partition for the exporters (``export lava``/``export nir`` deploy ``spiking_stack``) and the
energy report (``on_chip_modules`` prices exactly those modules on the chip). The conv spike
encoder reads real values (a MAC workload) and stays off-chip on the gateway's CPU, as do the
mean over T and the personal head. SpikeRNN: the stack of Linear + BatchNorm + LIF layers runs on
chip, one copy with d_qap input neurons per position (same weights at every position).
Spikformer / iSpikformer: only the spiking embedding (Linear + LIF, fed binary encoder spikes; per
position, resp. per channel for iSpikformer) runs on chip. Each block stays on the host: its
attention multiplies two spike tensors (Q K^T, attn V), which no Dense/Conv + LIF layer expresses,
and its q/k/v, out and MLP Linear + LIF layers read residual sums of spike tensors (x + attn(x):
counts 0, 1, 2, ..., not binary spikes) or feed those products.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import nn

from edge_agent.models.backbones.spike_rnn import SpikeRNN
from edge_agent.models.backbones.spikformer import ISpikformer, Spikformer
from edge_agent.models.backbones.spiking import BETA, SpikingLinear


class UnsupportedLayerError(ValueError):
    """A layer the target format cannot express; the message names the layer and why."""


@dataclass(frozen=True)
class DenseLIF:
    """``current = weight @ spikes + bias`` then a LIF neuron (reset to zero):
    ``v_t = beta * v_{t-1} * (1 - s_{t-1}) + current_t``, ``s_t = [v_t > threshold]``."""

    name: str
    weight: np.ndarray  # (out, in), float64, BatchNorm folded in
    bias: np.ndarray  # (out,)
    beta: float
    threshold: float
    modules: tuple[str, ...] = ()  # the model's modules this layer was built from (Linear, BatchNorm, LIF)


@dataclass(frozen=True)
class SpikingStack:
    """The on-chip layers in order (each layer's ``name`` is its module in the forecaster; the
    first one's input is the chip's input), plus what stays off-chip around them."""

    input_size: int
    layers: list[DenseLIF]
    off_chip: list[str] = field(default_factory=list)

    @property
    def modules(self) -> frozenset[str]:
        """Every model module the chip runs: what the energy report prices on-chip."""
        return frozenset(name for layer in self.layers for name in layer.modules)

    def run(self, spikes: np.ndarray) -> list[np.ndarray]:
        """Float reference simulation: input spikes (T, N, input_size) -> every layer's spikes."""
        outputs, x = [], spikes.astype(np.float64)
        for layer in self.layers:
            current = x @ layer.weight.T + layer.bias
            v, s, out = np.zeros(current.shape[1:]), np.zeros(current.shape[1:]), np.empty_like(current)
            for t in range(current.shape[0]):
                v = layer.beta * v * (1 - s) + current[t]
                s = (v > layer.threshold).astype(np.float64)
                out[t] = s
            outputs.append(out)
            x = out
        return outputs


def fold_batchnorm(linear: nn.Linear, norm: nn.BatchNorm1d) -> tuple[np.ndarray, np.ndarray]:
    """Eval-mode BatchNorm after a Linear, folded into its weight and bias (float64)."""
    weight = linear.weight.detach().double()
    bias = linear.bias.detach().double() if linear.bias is not None else weight.new_zeros(weight.shape[0])
    scale = norm.weight.detach().double() / (norm.running_var.double() + norm.eps).sqrt()
    shift = norm.bias.detach().double() - scale * norm.running_mean.double()
    return (scale[:, None] * weight).numpy(), (scale * bias + shift).numpy()


def spiking_stack(backbone: nn.Module, prefix: str = "shared.backbone") -> SpikingStack:
    """The on-chip Dense + LIF stack of ``backbone`` (see the module docstring for what runs where),
    or fail naming the first layer that is not one."""
    if isinstance(backbone, SpikeRNN):
        blocks = [(f"{prefix}.stack.{index}", block) for index, block in enumerate(backbone.stack)]
        host = []
    elif isinstance(backbone, (Spikformer, ISpikformer)):
        blocks = [(f"{prefix}.embed", backbone.embed)]
        host = [f"{prefix}.blocks.{index} (spiking self-attention: spike x spike products; Linear + LIF layers fed "
                "residual spike sums)" for index in range(len(backbone.blocks))]
    else:
        raise UnsupportedLayerError(_why_not(backbone, prefix))
    layers = []
    for name, block in blocks:
        if not isinstance(block, SpikingLinear):
            raise UnsupportedLayerError(f"{name}: {type(block).__name__} is not Linear + LIF")
        weight, bias = fold_batchnorm(block.linear, block.norm)
        modules = tuple(f"{name}.{part}" for part in ("linear", "norm", "lif"))
        layers.append(DenseLIF(name, weight, bias, BETA, float(block.lif.threshold), modules))
    return SpikingStack(
        input_size=layers[0].weight.shape[1], layers=layers,
        off_chip=[f"{prefix}.encoder (conv on real values)", *host, "mean over T and the personal head"],
    )


def on_chip_modules(backbone: nn.Module, prefix: str = "shared.backbone") -> frozenset[str]:
    """The modules ``export lava``/``export nir`` deploy on a chip: those of ``spiking_stack``,
    none when the backbone has no exportable stack (then nothing runs on the chip)."""
    try:
        return spiking_stack(backbone, prefix).modules
    except UnsupportedLayerError:
        return frozenset()


def _why_not(backbone: nn.Module, prefix: str) -> str:
    kind = getattr(backbone, "kind", "ann")
    if kind != "snn":
        return f"{prefix}: {type(backbone).__name__} is an ANN backbone; only spiking stacks export to this format"
    for name, module in backbone.named_modules():
        if type(module).__name__ == "SpikingSelfAttention":
            return (
                f"{prefix}.{name}: spiking self-attention multiplies two spike tensors (Q K^T, attn V); "
                "no Dense/Conv + LIF layer expresses that. Export it to ONNX instead"
            )
    return f"{prefix}: {type(backbone).__name__} has no Dense + LIF stack this exporter knows"
