"""Energy per forecast: operation counts x energy per operation of a hardware profile.

FedQAPer section 4.2: E = MACs x E_MAC + ACs x E_AC, reported per stage (pre-backbone, backbone,
head); neuron state updates are added where the profile prices them (the paper leaves them out).
An operation the target cannot run (a real-valued MAC on Loihi or TrueNorth) is not priced: its
count is listed as off-chip work instead of being given an invented cost. A target without
event-driven accumulates but with MACs (a GPU) runs spike-fed layers densely: every input, spike
or not, costs a MAC there, which is how an SNN executes on such hardware. Data movement (memory
reads and writes) is not counted, which flatters every target, ANNs most.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from export.opcount import LayerOps
from export.profiles import HardwareProfile

OPS = ("macs", "acs", "neuron_updates")
PROFILE_OP = {"macs": "mac", "acs": "ac", "neuron_updates": "neuron_update"}
STAGES = ("pre-backbone", "backbone", "head")


@dataclass
class StageEnergy:
    """Per-window operation counts and energy of one stage (or one layer)."""

    macs: float = 0.0
    acs: float = 0.0
    neuron_updates: float = 0.0
    pj: float = 0.0
    pj_by_op: dict[str, float] = field(default_factory=dict)
    off_chip: dict[str, float] = field(default_factory=dict)  # op -> count the target cannot price


@dataclass
class EnergyReport:
    """One model on one hardware target, per window (one forecast)."""

    profile: str
    precision: str
    windows: int
    stages: dict[str, StageEnergy]
    layers: dict[str, StageEnergy]
    firing_rate: float | None
    unpriced: list[str]

    @property
    def total_pj(self) -> float:
        return sum(stage.pj for stage in self.stages.values())

    @property
    def backbone_pj(self) -> float:
        return self.stages["backbone"].pj

    def as_dict(self) -> dict:
        return {**asdict(self), "total_pj": self.total_pj, "backbone_pj": self.backbone_pj}


def energy_report(
    layers: list[LayerOps], windows: int, profile: HardwareProfile, precision: str | None = None
) -> EnergyReport:
    """Price per-layer totals over ``windows`` windows with ``profile`` at ``precision``."""
    precision = precision or profile.default_precision
    stages = {name: StageEnergy() for name in STAGES}
    per_layer, unpriced = {}, set()
    for layer in layers:
        row = StageEnergy()
        for op in OPS:
            count = getattr(layer, op) / windows
            if not count:
                continue
            setattr(row, op, count)
            cost = profile.cost(PROFILE_OP[op], precision)
            dense = profile.cost("mac", precision) if op == "acs" else None
            if cost is not None:
                row.pj += count * cost.pj
                row.pj_by_op[op] = count * cost.pj
            elif dense is not None:  # no event-driven accumulate: the layer runs as dense MACs
                row.pj += layer.dense_macs / windows * dense.pj
                row.pj_by_op[op] = layer.dense_macs / windows * dense.pj
            elif not _included(profile, precision, PROFILE_OP[op]):
                row.off_chip[op] = count
                unpriced.add(PROFILE_OP[op])
        per_layer[layer.name] = row
        _add(stages[layer.stage], row)
    return EnergyReport(profile.name, precision, windows, stages, per_layer, firing_rate(layers), sorted(unpriced))


def _included(profile: HardwareProfile, precision: str, op: str) -> bool:
    """Whether another priced operation's figure already contains ``op`` (e.g. TrueNorth's
    energy per synaptic event covers the neuron update): then it costs nothing extra."""
    return any(
        cost is not None and op in cost.includes
        for cost in (profile.cost(other, precision) for other in PROFILE_OP.values() if other != op)
    )


def _add(total: StageEnergy, row: StageEnergy) -> None:
    for op in OPS:
        setattr(total, op, getattr(total, op) + getattr(row, op))
    total.pj += row.pj
    for op, pj in row.pj_by_op.items():
        total.pj_by_op[op] = total.pj_by_op.get(op, 0.0) + pj
    for op, count in row.off_chip.items():
        total.off_chip[op] = total.off_chip.get(op, 0.0) + count


def firing_rate(layers: list[LayerOps]) -> float | None:
    """Mean firing rate of all LIF neuron updates (None for an ANN)."""
    spiking = [(layer.firing_rate, layer.neuron_updates) for layer in layers if layer.firing_rate is not None]
    updates = sum(n for _, n in spiking)
    return sum(rate * n for rate, n in spiking) / updates if updates else None
