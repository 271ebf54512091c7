"""Energy per forecast: operation counts x energy per operation of a hardware profile.

FedQAPer section 4.2: E = MACs x E_MAC + ACs x E_AC, reported per stage (pre-backbone, backbone,
head); neuron state updates are added where the profile prices them (the paper leaves them out).
A target that runs the whole model (a CPU or GPU: it has MACs) prices every layer. A target
without MACs (Loihi, TrueNorth) is a neuromorphic chip: it runs exactly the spiking stack that
``export lava``/``export nir`` deploy (``chip_layers`` takes it from ``export.stack``, the
exporters' own definition), and everything else (encoder, pre-backbone, head) runs off-chip,
priced on a named host profile or listed as not priced, never given an invented cost. A target
without event-driven accumulates but with MACs (a GPU) runs spike-fed layers densely: every
input, spike or not, costs a MAC there, which is how an SNN executes on such hardware. Data
movement (memory reads and writes) is not counted, which flatters every target, ANNs most.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from edge_agent.models import Forecaster
from export.opcount import LayerOps
from export.profiles import HardwareProfile
from export.silence import silent_layers
from export.stack import on_chip_modules

OPS = ("macs", "acs", "neuron_updates")
COUNTS = (*OPS, "dense_macs")  # what a stage records: the ops, and spike-fed work a target without ACs ran densely
PROFILE_OP = {"macs": "mac", "acs": "ac", "neuron_updates": "neuron_update"}
STAGES = ("pre-backbone", "backbone", "head")


@dataclass
class StageEnergy:
    """Per-window operation counts and energy of one stage (or one layer)."""

    macs: float = 0.0
    acs: float = 0.0
    neuron_updates: float = 0.0
    dense_macs: float = 0.0  # spike-fed layers run as dense MACs (a target without ACs: every input multiplied)
    pj: float = 0.0  # on the target
    pj_by_op: dict[str, float] = field(default_factory=dict)
    off_chip: dict[str, float] = field(default_factory=dict)  # op -> count run off the target
    host_pj: float = 0.0  # the off-chip counts priced on the host profile


@dataclass
class EnergyReport:
    """One model on one hardware target, per window (one forecast)."""

    profile: str
    precision: str
    windows: int
    stages: dict[str, StageEnergy]
    layers: dict[str, StageEnergy]
    firing_rate: float | None
    unpriced: list[str]  # operations priced neither on the target nor on the host
    on_chip: list[str] | None = None  # the layers the target runs; None: all of them
    host: str | None = None  # the profile that prices the off-chip layers
    layer_rates: dict[str, float] = field(default_factory=dict)  # each LIF layer's firing rate

    @property
    def chip_pj(self) -> float:
        return sum(stage.pj for stage in self.stages.values())

    @property
    def host_pj(self) -> float:
        return sum(stage.host_pj for stage in self.stages.values())

    @property
    def total_pj(self) -> float:
        """On the target plus on the host (priced operations only)."""
        return self.chip_pj + self.host_pj

    @property
    def backbone_pj(self) -> float:
        """The backbone on the target only: the part a neuromorphic chip runs."""
        return self.stages["backbone"].pj

    @property
    def dense(self) -> bool:
        """Whether spike-fed layers ran as dense MACs here (a target without event-driven ACs)."""
        return any(stage.dense_macs for stage in self.stages.values())

    @property
    def silent(self) -> list[str]:
        """The LIF layers that never fired on the counted windows (``export.silence``)."""
        return silent_layers(self.layer_rates)

    def as_dict(self) -> dict:
        return {**asdict(self), "total_pj": self.total_pj, "chip_pj": self.chip_pj, "host_pj": self.host_pj,
                "backbone_pj": self.backbone_pj, "silent_layers": self.silent}


def chip_layers(model: Forecaster, profile: HardwareProfile) -> frozenset[str] | None:
    """The layers ``profile`` runs: all (None) on a target with MACs, which runs the whole model;
    on a neuromorphic target (no MACs at any precision) exactly the modules of the stack the
    Lava/NIR exporters deploy, none for a backbone they refuse."""
    return None if runs_whole_model(profile) else on_chip_modules(model.shared["backbone"])


def runs_whole_model(profile: HardwareProfile) -> bool:
    """A target with MACs at some precision (CPU, GPU) runs the whole exported model."""
    return any(table.mac is not None for table in profile.ops.values())


def energy_report(
    layers: list[LayerOps], windows: int, profile: HardwareProfile, precision: str | None = None,
    on_chip: frozenset[str] | None = None, host: HardwareProfile | None = None,
) -> EnergyReport:
    """Price per-layer totals over ``windows`` windows: the ``on_chip`` layers (None: all) with
    ``profile`` at ``precision``, the rest with ``host`` at its default precision, or unpriced."""
    precision = precision or profile.default_precision
    _check_placement(layers, profile, on_chip)
    stages = {name: StageEnergy() for name in STAGES}
    per_layer, unpriced = {}, set()
    for layer in layers:
        if on_chip is None or layer.name in on_chip:
            row = _priced(layer, windows, profile, precision, unpriced)
        else:
            row = _off_chip(layer, windows, host, unpriced)
        per_layer[layer.name] = row
        _add(stages[layer.stage], row)
    return EnergyReport(profile.name, precision, windows, stages, per_layer, firing_rate(layers), sorted(unpriced),
                        None if on_chip is None else sorted(on_chip & per_layer.keys()),
                        host.name if host and on_chip is not None else None,
                        {layer.name: layer.firing_rate for layer in layers if layer.firing_rate is not None})


def _check_placement(layers: list[LayerOps], profile: HardwareProfile, on_chip: frozenset[str] | None) -> None:
    """A neuromorphic target needs its on-chip set, and a non-empty set must name counted layers."""
    if on_chip is None and not runs_whole_model(profile):
        raise ValueError(f"{profile.name} runs only the exported spiking stack: pass on_chip=chip_layers(model, profile)")
    if on_chip and not on_chip & {layer.name for layer in layers}:
        raise ValueError(f"no counted layer is on-chip (on-chip modules: {sorted(on_chip)[:5]})")


def _priced(layer: LayerOps, windows: int, profile: HardwareProfile, precision: str, unpriced: set[str]) -> StageEnergy:
    """One layer on ``profile``: each op at its price, a spike-fed layer as dense MACs on a target
    without ACs (``_dense``), and an op the target cannot run listed as off-chip (added to ``unpriced``)."""
    row = StageEnergy()
    for op in OPS:
        count = getattr(layer, op) / windows
        cost = profile.cost(PROFILE_OP[op], precision)
        if op == "acs" and layer.cost == "ac" and cost is None and _dense(row, layer, windows, profile, precision):
            continue
        if not count:
            continue
        setattr(row, op, count)
        if cost is not None:
            row.pj_by_op[op] = count * cost.pj
        elif not _included(profile, precision, PROFILE_OP[op]):
            row.off_chip[op] = count
            unpriced.add(PROFILE_OP[op])
    row.pj = sum(row.pj_by_op.values())
    return row


def _dense(row: StageEnergy, layer: LayerOps, windows: int, profile: HardwareProfile, precision: str) -> bool:
    """A spike-fed layer on a target without event-driven ACs but with MACs (a GPU) runs densely:
    every input, spike or not (none included), costs a MAC; recorded as ``dense_macs``. False
    where the target has no MACs either."""
    mac = profile.cost("mac", precision)
    if mac is None:
        return False
    row.dense_macs = layer.dense_macs / windows
    row.pj_by_op["dense_macs"] = row.dense_macs * mac.pj
    return True


def _off_chip(layer: LayerOps, windows: int, host: HardwareProfile | None, unpriced: set[str]) -> StageEnergy:
    """One layer the target does not run: all its counts off-chip, priced on ``host`` if given."""
    if host is None:
        row = StageEnergy(**{op: getattr(layer, op) / windows for op in OPS})
        unpriced.update(PROFILE_OP[op] for op in OPS if getattr(row, op))
    else:
        row = _priced(layer, windows, host, host.default_precision, unpriced)
        row.host_pj, row.pj, row.pj_by_op = row.pj, 0.0, {}
    row.off_chip = {op: getattr(row, op) for op in COUNTS if getattr(row, op)}
    return row


def _included(profile: HardwareProfile, precision: str, op: str) -> bool:
    """Whether another priced operation's figure already contains ``op`` (e.g. TrueNorth's
    energy per synaptic event covers the neuron update): then it costs nothing extra."""
    return any(
        cost is not None and op in cost.includes
        for cost in (profile.cost(other, precision) for other in PROFILE_OP.values() if other != op)
    )


def _add(total: StageEnergy, row: StageEnergy) -> None:
    for op in COUNTS:
        setattr(total, op, getattr(total, op) + getattr(row, op))
    total.pj += row.pj
    total.host_pj += row.host_pj
    for op, pj in row.pj_by_op.items():
        total.pj_by_op[op] = total.pj_by_op.get(op, 0.0) + pj
    for op, count in row.off_chip.items():
        total.off_chip[op] = total.off_chip.get(op, 0.0) + count


def firing_rate(layers: list[LayerOps]) -> float | None:
    """Mean firing rate of all LIF neuron updates over every window (None for an ANN)."""
    spiking = [layer for layer in layers if layer.cost == "neuron_update"]
    updates = sum(layer.neuron_updates for layer in spiking)
    return sum(layer.spikes for layer in spiking) / updates if updates else None
