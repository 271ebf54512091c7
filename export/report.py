"""Energy reports as a user reads them: markdown tables, JSON and a bar chart per stage."""

from __future__ import annotations

import json
from pathlib import Path

from export.energy import STAGES, EnergyReport
from export.silence import silence_line


def _count(value: float) -> str:
    return f"{value:.3g}" if value else "0"


def markdown(model: str, reports: list[EnergyReport]) -> str:
    """Per profile: stages (ops and pJ per forecast), then the ten most expensive layers."""
    lines = [f"# Energy per forecast: {model}", ""]
    for report in reports:
        rate = f"{report.firing_rate:.3f}" if report.firing_rate is not None else "-"
        lines += [
            f"## {report.profile} ({report.precision}), mean over {report.windows} real windows, firing rate {rate}",
            "", _placement(report), *_rates(report), "",
            f"| stage | MACs | {_spike_fed(report)[0]} | neuron updates | energy on target (pJ) "
            "| ops off-chip or not priced | off-chip pJ |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in STAGES:
            stage = report.stages[name]
            off = ", ".join(f"{_count(n)} {op}" for op, n in stage.off_chip.items()) or "-"
            lines.append(f"| {name} | {_count(stage.macs)} | {_count(getattr(stage, _spike_fed(report)[1]))} | "
                         f"{_count(stage.neuron_updates)} | {stage.pj:.4g} | {off} | {stage.host_pj:.4g} |")
        lines += [f"| **total** | | | | **{report.chip_pj:.4g}** | | **{report.host_pj:.4g}** |", "",
                  f"| layer | MACs | {_spike_fed(report)[0]} | energy on target (pJ) | off-chip pJ |", "|---|---|---|---|---|"]
        for name, row in sorted(report.layers.items(), key=lambda item: -item[1].pj - item[1].host_pj)[:10]:
            lines.append(f"| {name} | {_count(row.macs)} | {_count(getattr(row, _spike_fed(report)[1]))} | "
                         f"{row.pj:.4g} | {row.host_pj:.4g} |")
        lines.append("")
    lines.append("Caveats: memory traffic is not counted; elementwise work without parameters (residual adds, "
                 "normalisation of the input window, the mean over T) is not counted; ops a target cannot run "
                 "run off-chip: priced on the host profile when one is named, otherwise listed, not priced.")
    return "\n".join(lines) + "\n"


def _spike_fed(report: EnergyReport) -> tuple[str, str]:
    """The column of spike-fed work and its field: ACs on an event-driven target; on one without ACs
    (a GPU) the dense MACs those layers run, labelled as such beside the dense energy they cost."""
    return ("dense MACs of spike-fed layers", "dense_macs") if report.dense else ("ACs", "acs")


def _rates(report: EnergyReport) -> list[str]:
    """Each spiking layer's firing rate, a silent one called out: its energy describes no computation."""
    if not report.layer_rates:
        return []
    rates = ", ".join(f"{name} {rate:.3f}" for name, rate in report.layer_rates.items())
    warning = f" **Silent: {silence_line(report.silent, report.windows)}.**" if report.silent else ""
    return ["", f"Firing rates: {rates}.{warning}"]


def notices(reports: list[EnergyReport]) -> list[str]:
    """What a reader must not miss, one line each, for the console: LIF layers that never fired
    (once: every report counted the same windows), and each target that runs nothing of the model."""
    silent = next((report for report in reports if report.silent), None)
    lines = [f"{silence_line(silent.silent, silent.windows)}: their energy describes no computation"] if silent else []
    for report in reports:
        if report.on_chip == []:
            where = f"priced on {report.host}" if report.host else "not priced (--host cmos45nm prices it there)"
            lines.append(f"{report.profile} runs no layer of this model (the exporters deploy no spiking stack of "
                         f"its backbone): the whole model runs off-chip, {where}")
    return lines


def _placement(report: EnergyReport) -> str:
    """Where the layers run: all on the target, or the exported stack on chip and the rest off it."""
    if report.on_chip is None:
        return "The whole model runs on this target."
    where = f"priced on {report.host}" if report.host else "not priced"
    return (f"On chip: the {len(report.on_chip)} layers of the exported spiking stack "
            f"({', '.join(report.on_chip) or 'none: the exporters refuse this backbone'}); the rest runs off-chip, {where}.")


def plot(model: str, reports: list[EnergyReport], path: Path) -> None:
    """Energy per stage on the target and off it on the host, per profile, log scale (targets
    differ by orders of magnitude); a stage that costs nothing gets no bar, a "0" label instead."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 + 1.9 * len(reports), 3.4))
    parts = [(stage, lambda r, s=stage: r.stages[s].pj) for stage in STAGES] + [("off-chip (host)", _host)]
    width = 0.8 / len(parts)
    for offset, (label, value) in enumerate(parts):
        positions = [i + (offset - (len(parts) - 1) / 2) * width for i in range(len(reports))]
        values = [value(report) for report in reports]
        ax.bar(positions, [v if v > 0 else float("nan") for v in values], width, label=label)
        for x, v in zip(positions, values):
            if v <= 0:
                ax.annotate("0", (x, 0), xycoords=("data", "axes fraction"), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(reports)), [f"{r.profile}\n{r.precision}\ntotal {r.total_pj:.3g} pJ" for r in reports])
    ax.set_xlim(-0.5, len(reports) - 0.5)  # a missing bar sets no limit: keep every "0" label inside the axes
    ax.set(ylabel="pJ per forecast", title=model)
    if any(report.total_pj > 0 for report in reports):
        ax.set_yscale("log")
    else:  # a log axis needs a bar: with none, the "0" labels and a statement
        ax.set(ylim=(0, 1), yticks=[])
        ax.text(0.5, 0.5, "nothing priced\n(off-chip: name a host)", transform=ax.transAxes, ha="center", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _host(report: EnergyReport) -> float:
    return report.host_pj


def write(folder: Path, model: str, reports: list[EnergyReport]) -> list[Path]:
    """energy.md, energy.json and energy.png in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "energy.md", folder / "energy.json", folder / "energy.png"]
    paths[0].write_text(markdown(model, reports))
    paths[1].write_text(json.dumps({"model": model, "reports": [r.as_dict() for r in reports]}, indent=2))
    plot(model, reports, paths[2])
    return paths
