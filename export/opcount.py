"""Operation counts of a forecaster on real windows: MACs, ACs and neuron updates per layer.

FedQAPer section 4.2: real-valued inputs cost multiply-accumulates (MACs); a layer fed spikes
only accumulates (ACs) where a spike arrived, so its cost scales with the firing rate. Whether a
layer is fed spikes follows from the model's structure, never from the values that arrive (an
all-zero real input is still a MAC workload): ``SpikeTrace`` follows every tensor from the LIF
layers that emit it through views, concatenations and sums, and the kind a layer gets on its
first call is fixed for the whole count. Counts are exact over the given windows, not
rate x estimate: a spike-fed layer costs value x fan-out ACs per input (a residual sum of spike
tensors holds 0, 1, 2, ...: a 2 is two spikes arriving together). Counts and rates accumulate
over every window of every batch.

Every module with parameters must be counted by a rule in ``RULES`` (whole modules, never their
functional insides, so fused or functional code paths cannot be silently skipped); a model with
an unknown parameterized module is refused. Parameter-free elementwise work (residual adds,
instance norm, mean over T) is not counted, except a quantile head's non-crossing transform
(``MonotoneQuantiles``), which is work only quantile models do. Data movement is not counted either.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakTensorKeyDictionary

from edge_agent.data import WindowSet
from edge_agent.models import Forecaster
from edge_agent.models.backbones.spiking import LIF, SpikingSelfAttention
from edge_agent.models.backbones.dlinear import DLinear
from edge_agent.models.heads import MonotoneQuantiles
from edge_agent.models.qap import QueryAttentionPooling, QueryPooling, SlotEmbedding, TimeFusion
from edge_agent.models.seasonal import SeasonalBase


SPIKE_VIEWS = {"view", "reshape", "flatten", "unflatten", "transpose", "permute", "contiguous", "__getitem__",
               "squeeze", "unsqueeze", "clone", "detach", "cat", "stack"}  # spikes in, the same spikes out
SPIKE_SUMS = {"add", "__add__", "__radd__", "__iadd__", "add_"}  # spikes + spikes: spike counts


class SpikeTrace(TorchFunctionMode):
    """Which tensors carry spikes, by the operations that made them: a LIF layer's output does
    (``mark``); a view, indexing or concatenation of spike tensors, or a sum of them, does too;
    any other operation (a mean over T, a scaling, a matmul) yields real values."""

    def __init__(self) -> None:
        super().__init__()
        self._spiking = WeakTensorKeyDictionary()

    def mark(self, tensor: torch.Tensor) -> None:
        self._spiking[tensor] = True

    def carries_spikes(self, tensor: object) -> bool:
        return isinstance(tensor, torch.Tensor) and tensor in self._spiking

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        sources = args[0] if name in ("cat", "stack") else args[:1] if name in SPIKE_VIEWS else args[:2]
        if (name in SPIKE_VIEWS or name in SPIKE_SUMS) and sources and all(map(self.carries_spikes, sources)):
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                self.mark(tensor)
        return out


@dataclass
class LayerOps:
    """Totals over every counted window. ``cost`` is the operation the layer performs ("mac",
    "ac" or "neuron_update"), decided from the model's structure on its first call."""

    name: str
    kind: str
    stage: str
    cost: str = ""
    macs: float = 0.0
    acs: float = 0.0
    neuron_updates: float = 0.0
    calls: int = 0
    dense_macs: float = 0.0  # what the spike-driven ACs cost as dense MACs (an SNN on a GPU)
    inputs: float = 0.0  # inputs that reached a spike-fed layer, and how many were non-zero
    active_inputs: float = 0.0
    spikes: float = 0.0  # spikes a LIF layer emitted over ``neuron_updates`` steps
    input_spikes: float = 0.0  # spikes that reached a spike-fed Linear (a 2 counts twice): ACs / fan_out
    input_shape: tuple[int, ...] = ()  # of the first call, batch included
    fan_out: int = 0  # outputs each input reaches (Linear: out_features; Conv: maps x kernel taps)

    @property
    def input_rate(self) -> float | None:
        """Share of non-zero inputs of a spike-fed layer, over every counted window."""
        return self.active_inputs / self.inputs if self.inputs else None

    @property
    def firing_rate(self) -> float | None:
        """Share of spiking neuron steps of a LIF layer, over every counted window."""
        return self.spikes / self.neuron_updates if self.cost == "neuron_update" and self.neuron_updates else None

    def as_dict(self) -> dict:
        return {**asdict(self), "input_rate": self.input_rate, "firing_rate": self.firing_rate}


def _inputs(ops: LayerOps, x: torch.Tensor) -> None:
    ops.inputs += x.numel()
    ops.active_inputs += float((x != 0).sum())


def _dense(ops: LayerOps, x: torch.Tensor, fan_out: int, fan_in: int) -> None:
    """A dense map applied to every row of ``x`` (last axis = fan_in)."""
    rows = x.numel() // fan_in
    if ops.cost == "mac":
        ops.macs += rows * fan_in * fan_out
    else:
        ops.input_spikes += float(x.sum())
        ops.acs += float(x.sum()) * fan_out
        ops.dense_macs += rows * fan_in * fan_out
        _inputs(ops, x)


def _linear(ops: LayerOps, module: nn.Linear, args: tuple, out: torch.Tensor) -> None:
    _dense(ops, args[0], module.out_features, module.in_features)


def _conv(ops: LayerOps, module: nn.Conv2d, args: tuple, out: torch.Tensor) -> None:
    per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
    ops.macs += out.numel() * per_output


def _lif(ops: LayerOps, module: LIF, args: tuple, out: torch.Tensor) -> None:
    ops.neuron_updates += out.numel()
    ops.spikes += float(out.sum())


def _recurrent(ops: LayerOps, module: nn.LSTM | nn.GRU, args: tuple, out: tuple) -> None:
    """Gates x (input + hidden) x hidden MACs per step per layer (4 gates LSTM, 3 GRU)."""
    batch, steps = args[0].shape[:2]
    gates = 4 if isinstance(module, nn.LSTM) else 3
    width = module.input_size
    for _ in range(module.num_layers):
        ops.macs += batch * steps * gates * (width + module.hidden_size) * module.hidden_size
        width = module.hidden_size


def _encoder_layer(ops: LayerOps, module: nn.TransformerEncoderLayer, args: tuple, out: torch.Tensor) -> None:
    """Q/K/V/out projections, QK^T and attn V over N tokens of width d, and the two FFN layers."""
    batch, tokens, d = args[0].shape
    ffn = module.linear1.out_features
    ops.macs += batch * (4 * tokens * d * d + 2 * tokens * tokens * d + 2 * tokens * d * ffn)


def _query_pooling(ops: LayerOps, module: QueryPooling, args: tuple, out: torch.Tensor) -> None:
    """Q queries over N sets of F vectors of width d with h heads (see ``QueryPooling``): the
    query projection and its fold into the key weights (2 Q d^2, once), then per set the scores
    and the pooling (2 F d Q h) and the value and output projections of the pooled vectors
    (2 Q d^2)."""
    queries, x = args
    n_sets, n_vectors, d = x.shape
    q = queries.shape[0]
    ops.macs += 2 * q * d * d + n_sets * (2 * n_vectors * d * q * module.heads + 2 * q * d * d)


def _dlinear(ops: LayerOps, module: DLinear, args: tuple, out: torch.Tensor) -> None:
    """The moving average (k MACs per value, as the equivalent convolution) and the seasonal
    and trend maps L -> H over every channel."""
    batch, length, channels = args[0].shape
    horizon = module.seasonal.out_features
    ops.macs += batch * channels * (length * module.kernel + 2 * length * horizon)


def _time_fusion(ops: LayerOps, module: TimeFusion, args: tuple, out: torch.Tensor) -> None:
    """The time projection once per window (t -> d per step), the concat Linear's time half once
    per window and its value half once per sequence (2d -> d, applied as two d -> d halves)."""
    z, marks = args
    d = z.shape[-1]
    ops.macs += marks.numel() * d + marks.numel() // marks.shape[-1] * d * d + z.numel() * d


def _seasonal_base(ops: LayerOps, module: SeasonalBase, args: tuple, out: torch.Tensor) -> None:
    """The weighted mean of the lookback's last seasons: one MAC per season per forecast value."""
    ops.macs += out.numel() * module.weights.numel()


def _spiking_attention(ops: LayerOps, module: SpikingSelfAttention, args: tuple, out: torch.Tensor) -> None:
    """Only the spike-spike matmuls and the normalization between them: the q/k/v/out projections
    and LIFs are counted as their own layers. QK^T costs one AC per pair of co-active query and key
    bits; attn x V one AC per (query row, spiking value) pair, the value being binary; the
    BatchNorm of the N x D result one MAC (its multiply-add) per value: no weight layer precedes
    it, so it cannot be folded."""
    q, k, v = module.last_qkv
    ops.macs += v.numel()
    ops.acs += float((q @ k.transpose(-2, -1)).sum()) + float(v.sum()) * q.shape[-2]
    ops.dense_macs += 2 * q.numel() * k.shape[-2]
    for x in (q, k, v):
        _inputs(ops, x)


def _monotone(ops: LayerOps, module: MonotoneQuantiles, args: tuple, out: torch.Tensor) -> None:
    """A quantile head's non-crossing transform: per forecast value, Q - 1 softplus gaps and Q - 1
    additions of them to the neighbouring level, each counted as one MAC (an addition costs less,
    a softplus more: an exp and a log). The head's linear read-out, Q outputs per forecast value,
    is counted as its own layers."""
    levels = args[0].shape[-1]
    ops.macs += args[0].numel() // levels * 2 * (levels - 1)


Rule = Callable[[LayerOps, nn.Module, tuple, object], None]
RULES: dict[type[nn.Module], Rule] = {
    nn.Linear: _linear,
    nn.Conv2d: _conv,
    LIF: _lif,
    nn.LSTM: _recurrent,
    nn.GRU: _recurrent,
    nn.TransformerEncoderLayer: _encoder_layer,
    QueryPooling: _query_pooling,
    DLinear: _dlinear,
    TimeFusion: _time_fusion,
    SeasonalBase: _seasonal_base,
    MonotoneQuantiles: _monotone,
}
FOLDED = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm)  # folded or elementwise: not counted
DATA_ONLY = (QueryAttentionPooling, SlotEmbedding)  # own parameters only feed counted ops or adds


def stage_of(name: str) -> str:
    if name.startswith("shared.backbone"):
        return "backbone"
    return "head" if name.startswith(("personal.head", "shared.head", "shared.base")) else "pre-backbone"


def count_ops(model: Forecaster, windows: WindowSet, batch_size: int = 256) -> tuple[list[LayerOps], int]:
    """Per-layer totals over every window of ``windows`` (divide by the count for per-window)."""
    model = model.eval()

    def run() -> None:
        for x, marks, _ in windows.batches(batch_size, shuffle=False):
            model(x, marks)

    return measure(model, run), len(windows)


def firing_rates(model: Forecaster, windows: WindowSet, limit: int = 64) -> dict[str, float]:
    """Each LIF layer's firing rate over the first ``limit`` windows (empty for an ANN): how much
    a spiking model computes; a layer at 0 forwards nothing."""
    if not any(isinstance(module, LIF) for module in model.modules()):
        return {}
    first = replace(windows, starts=windows.starts[:limit])
    return {layer.name: layer.firing_rate for layer in count_ops(model, first)[0] if layer.firing_rate is not None}


def measure(model: nn.Module, run: Callable[[], object]) -> list[LayerOps]:
    """Count every operation of ``model`` while ``run`` uses it (in eval mode, without grad)."""
    counted = _counted_modules(model)
    layers = {name: LayerOps(name, type(m).__name__, stage_of(name)) for name, m in counted.items()}
    trace = SpikeTrace()
    hooks = [m.register_forward_hook(_hook(layers[name], RULES.get(type(m), _spiking_attention), trace))
             for name, m in counted.items()]
    attention = [m for m in model.modules() if isinstance(m, SpikingSelfAttention)]
    for module in attention:
        module.record_qkv = True
    try:
        with torch.no_grad(), trace:
            run()
    finally:
        for hook in hooks:
            hook.remove()
        for module in attention:
            module.record_qkv, module.last_qkv = False, None
    silent = [name for name, ops in layers.items() if not ops.calls]
    if silent:
        raise RuntimeError(f"layers that never ran, so their operations could not be counted: {silent[:5]}")
    return list(layers.values())


def cost_of(name: str, module: nn.Module, fed_spikes: bool) -> str:
    """The operation a layer performs, from what feeds it: a LIF layer updates neurons; spiking
    attention and a Linear fed spikes accumulate; every other counted layer multiplies real values
    (refused when spikes feed it: no AC rule is written for it)."""
    if isinstance(module, LIF):
        return "neuron_update"
    if isinstance(module, SpikingSelfAttention) or (fed_spikes and isinstance(module, nn.Linear)):
        return "ac"
    if fed_spikes:
        raise NotImplementedError(f"{name}: counting a {type(module).__name__} fed spikes is not implemented")
    return "mac"


def fan_out(module: nn.Module) -> int:
    """How many outputs one input of a Linear or Conv2d reaches (0 for other layers)."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, nn.Conv2d):
        return module.out_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
    return 0


def _hook(ops: LayerOps, rule: Rule, trace: SpikeTrace):
    def record(module: nn.Module, args: tuple, out: object) -> None:
        cost = cost_of(ops.name, module, trace.carries_spikes(args[0]))
        if ops.cost and cost != ops.cost:
            raise RuntimeError(f"{ops.name}: fed differently between calls ({ops.cost}, then {cost})")
        if not ops.calls:
            ops.input_shape, ops.fan_out = tuple(getattr(args[0], "shape", ())), fan_out(module)
        ops.cost = cost
        ops.calls += 1
        rule(ops, module, args, out)
        if cost == "neuron_update":
            trace.mark(out)

    return record


def _counted_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules that carry a rule; refuses a parameterized module no rule covers."""
    counted: dict[str, nn.Module] = {}
    covered: set[str] = set()
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in covered):
            continue
        if type(module) in RULES or isinstance(module, SpikingSelfAttention):
            counted[name] = module
            if type(module) in RULES:
                covered.add(name)
        elif isinstance(module, FOLDED):
            covered.add(name)
        elif isinstance(module, DATA_ONLY):
            continue
        elif any(True for _ in module.parameters(recurse=False)):
            raise NotImplementedError(f"{name}: no operation-count rule for {type(module).__name__}")
    return counted
