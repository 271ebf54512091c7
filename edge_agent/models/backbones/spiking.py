"""Spiking building blocks after SeqSNN (Lv et al. 2024), written with snntorch.

Neurons are LIF with tau = 2: snntorch ``Leaky(beta=0.5)`` with the 1/tau input gain folded
into the preceding layer's weights, threshold 1.0, arctan surrogate gradient, reset to zero
(the only reset NIR and Lava's CUBA neuron express), run for ``T`` steps. Tensors inside
spiking stacks are laid out (T, B, N, D).
"""

from __future__ import annotations

import snntorch as snn
import torch
from snntorch import surrogate
from torch import nn

from edge_agent.models.backbones.base import Backbone

TAU = 2.0
BETA = 1.0 - 1.0 / TAU
THRESHOLD = 1.0
ALPHA = 2.0  # arctan surrogate slope (snntorch's default)


def lif_step(
    current: torch.Tensor, mem: torch.Tensor, spike: torch.Tensor, beta: float, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One LIF update: h_t = beta * h_{t-1} * (1 - s_{t-1}) + x_t, s_t = [h_t > threshold]."""
    mem = current + beta * mem * (1 - spike)
    return mem, (mem > threshold).to(current.dtype)


def lif_steps(current: torch.Tensor, beta: float, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Membranes and spikes of T steps from rest, plain tensor ops (what ONNX export records)."""
    mem, spike = torch.zeros_like(current[0]), torch.zeros_like(current[0])
    membranes, spikes = [], []
    for t in range(current.shape[0]):
        mem, spike = lif_step(current[t], mem, spike, beta, threshold)
        membranes.append(mem)
        spikes.append(spike)
    return torch.stack(membranes), torch.stack(spikes)


class MultiStepLIF(torch.autograd.Function):
    """T steps of snntorch's ``Leaky`` (reset to zero, arctan surrogate) fused into one op.

    Forward: h_t = beta * h_{t-1} * (1 - s_{t-1}) + x_t, s_t = [h_t > threshold]. Backward:
    backpropagation through time with snntorch's ATan surrogate and the reset detached, as
    snntorch does. Same spikes and gradients as stepping ``snn.Leaky`` (tested), without
    recording a dozen autograd nodes per step, which made LIF half of a spiking model's time.
    """

    @staticmethod
    def forward(ctx, current: torch.Tensor, beta: float, threshold: float, alpha: float) -> torch.Tensor:
        membrane, spikes = lif_steps(current, beta, threshold)
        ctx.save_for_backward(membrane, spikes)
        ctx.beta, ctx.threshold, ctx.alpha = beta, threshold, alpha
        return spikes

    @staticmethod
    def backward(ctx, grad_spikes: torch.Tensor):
        membrane, spikes = ctx.saved_tensors
        shifted = (torch.pi / 2 * ctx.alpha) * (membrane - ctx.threshold)
        local = grad_spikes * (ctx.alpha / 2) / (1 + shifted.square())
        grad = torch.empty_like(local)
        carry = torch.zeros_like(local[0])
        for t in reversed(range(local.shape[0])):
            carry = local[t] + carry
            grad[t] = carry
            if t:
                carry = carry * ctx.beta * (1 - spikes[t - 1])
        return grad, None, None, None


class LIF(nn.Module):
    """Multi-step leaky integrate-and-fire layer: currents (T, ...) -> spikes (T, ...).

    ``neuron`` is the equivalent snntorch ``Leaky``; ``step_by_step`` runs it directly, the
    default runs the fused ``MultiStepLIF``.
    """

    def __init__(self, threshold: float = THRESHOLD):
        super().__init__()
        self.threshold = threshold
        self.neuron = snn.Leaky(
            beta=BETA, threshold=threshold, spike_grad=surrogate.atan(ALPHA), reset_mechanism="zero"
        )
        self.state: tuple[torch.Tensor, torch.Tensor] | None = None  # set for streaming

    def forward(self, current: torch.Tensor) -> torch.Tensor:
        """Currents (T, ...) -> spikes (T, ...); in streaming mode (``state`` set) one step:
        currents (...) -> spikes (...), advancing ``state`` = (membrane, last spikes)."""
        if self.state is not None:
            self.state = lif_step(current, *self.state, BETA, self.threshold)
            return self.state[1]
        if torch.is_grad_enabled() and current.requires_grad:
            return MultiStepLIF.apply(current, BETA, self.threshold, ALPHA)
        return lif_steps(current, BETA, self.threshold)[1]

    def step_by_step(self, current: torch.Tensor) -> torch.Tensor:
        """The same layer run through snntorch's ``Leaky`` one step at a time (the reference)."""
        mem = torch.zeros_like(current[0])
        spikes = []
        for step in current:
            spike, mem = self.neuron(step, mem)
            spikes.append(spike)
        return torch.stack(spikes)


class SpikingLinear(nn.Module):
    """Linear, BatchNorm over channels, LIF, at every step.

    SeqSNN normalizes inside attention/MLP and the inverted embedding only; we normalize after
    every Linear because SpikeRNN's and Spikformer's un-normalized first layers never reach
    threshold from a d_qap-wide input at initialisation (measured: 0.1% firing, no gradient).
    BatchNorm folds into the weights for neuromorphic export.
    """

    def __init__(self, d_in: int, d_out: int, threshold: float = THRESHOLD):
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.norm = nn.BatchNorm1d(d_out)
        self.lif = LIF(threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        current = self.norm(self.linear(x).flatten(0, -2)).reshape(*x.shape[:-1], -1)
        return self.lif(current)


class ConvSpikeEncoder(nn.Module):
    """SeqSNN's conv encoder: a (1 x k) convolution over time with T output maps, one per step.

    (B, L, C) real values -> (T, B, L, C) spikes.
    """

    def __init__(self, steps: int, kernel: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(1, steps, (1, kernel), padding=(0, kernel // 2))
        self.norm = nn.BatchNorm2d(steps)
        self.lif = LIF()

    def currents(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, C) real values -> (T, B, L, C) input currents of the encoder's LIF."""
        return self.norm(self.conv(x.transpose(1, 2).unsqueeze(1))).permute(1, 0, 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lif(self.currents(x))


class SpikingBackbone(Backbone):
    """A conv spike encoder, then spiking layers run for T steps, rates averaged over T.

    Split so a gateway can stream it (``export.onnx``): ``encoder.currents`` once, then per step
    the encoder LIF and ``spike_steps``, then ``readout`` of the mean rate.
    """

    kind = "snn"
    encoder: ConvSpikeEncoder

    def spike_steps(self, spikes: torch.Tensor) -> torch.Tensor:
        """Encoder spikes (T, B, L, d_qap) -> the last layer's spikes (T, B, ...)."""
        raise NotImplementedError

    def readout(self, rate: torch.Tensor) -> torch.Tensor:
        """Mean spikes over T -> the (B, A, C) representation for the head."""
        return rate

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.readout(self.spike_steps(self.encoder(z)).mean(0))


class SpikingSelfAttention(nn.Module):
    """Spiking self-attention: Q, K, V are spikes, no softmax; Q K^T V is batch-normalized
    before the attention LIF (threshold 0.5, as Spikformer's).

    Spikformer scales the scores by a fixed 0.125 instead. Its attention LIF then reads sums
    over N tokens that grow with the cube of the Q, K and V rates, tuned for hundreds of tokens:
    with a gateway's handful of channel tokens (iSpikformer) that LIF stayed all but silent under
    the default recipe (rate 0.003, 0.000 on one seed; bench/firing.py at 5abc4cb). The
    BatchNorm sets the LIF's operating point whatever N and the rates; at inference it is one
    multiply-add per value (counted, ``export.opcount``), cheaper than the N x N scaling it replaces.
    """

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"hidden ({dim}) must be divisible by heads ({heads})")
        self.heads = heads
        self.q, self.k, self.v = (SpikingLinear(dim, dim) for _ in range(3))
        self.norm = nn.BatchNorm1d(dim)
        self.attn_lif = LIF(THRESHOLD / 2)
        self.out = SpikingLinear(dim, dim)
        self.record_qkv = False  # operation counting (export.opcount) reads the spike matrices
        self.last_qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def split(self, x: torch.Tensor) -> torch.Tensor:
        """(..., N, D) -> (..., heads, N, D / heads). A reshape to the input's own leading sizes:
        ``unflatten(-1, (heads, -1))`` exports to ONNX as a reshape of unknown rank, after which the
        exporter takes every later shape from the export batch (the graph then fails at any other)."""
        return x.reshape(*x.shape[:-1], self.heads, -1).transpose(-3, -2)

    def currents(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Split Q, K, V spikes (..., heads, N, D / heads) -> the attention LIF's input (..., N, D)."""
        mixed = (q @ k.transpose(-2, -1) @ v).transpose(-3, -2).flatten(-2)
        return self.norm(mixed.flatten(0, -2)).view_as(mixed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split(proj(x)) for proj in (self.q, self.k, self.v))
        if self.record_qkv:
            self.last_qkv = (q, k, v)
        return self.out(self.attn_lif(self.currents(q, k, v)))


class SpikingBlock(nn.Module):
    """Spikformer block: residual spiking self-attention, then a residual two-layer spiking MLP."""

    def __init__(self, dim: int, d_ff: int, heads: int):
        super().__init__()
        self.attn = SpikingSelfAttention(dim, heads)
        self.mlp = nn.Sequential(SpikingLinear(dim, d_ff), SpikingLinear(d_ff, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


def init_transformer_weights(module: nn.Module) -> None:
    """Spikformer's initialisation: N(0, 0.02) linear weights, zero biases."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
