"""``edgefl export ...``: a trained client model to ONNX, Lava netx or NIR, verified on real windows."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from edgefl.errors import LazyConsole, fail, say
from edgefl.extras import needs

if TYPE_CHECKING:
    from edge_agent.data import ClientData
    from edge_agent.models import Forecaster
    from export.contract import ExportReport

console = LazyConsole(soft_wrap=True)
export_app = typer.Typer(help="Export a trained model: ONNX, Lava netx HDF5, NIR.", no_args_is_help=True)

Checkpoint = Annotated[Optional[Path], typer.Option(help="model file (edgefl simulate --save-models, agent checkpoint)")]
AgentConfigPath = Annotated[Optional[Path], typer.Option("--agent-config", help="use this agent's model and data")]
Site = Annotated[Optional[str], typer.Option(help="bundled weather site (or 'pool': all sites) to verify on")]
Csv = Annotated[Optional[Path], typer.Option("--csv", help="CSV whose windows verify the export")]
Windows = Annotated[int, typer.Option(min=1, help="real test windows used to verify the export")]
AllowSilent = Annotated[bool, typer.Option(help="export even when a LIF layer emits no spike on the windows checked "
                                                 "(its spike check compares nothing): a warning instead of a refusal")]


def model_and_data(
    checkpoint: Path | None, agent_config: Path | None, site: str | None, csv: Path | None
) -> tuple[Forecaster, ClientData]:
    """The model to export and the data whose held-out windows verify it (same features). The
    flags, files and agent config are checked before torch and pandas are imported."""
    from edge_agent.config import AgentConfig, ConfigError, load_config
    from edge_agent.data import DataError
    from edge_agent.data.errors import file_not_found

    try:
        if agent_config is None and (checkpoint is None or (site is None) == (csv is None)):
            raise ValueError("give --agent-config, or --checkpoint with one of --site / --csv")
        for path in (checkpoint, csv):
            if path is not None and not path.is_file():
                raise file_not_found(path)
        cfg = load_config(agent_config, AgentConfig) if agent_config is not None else None
    except (ConfigError, DataError, ValueError) as err:
        fail(str(err))
    from edge_agent.data import build_pool, load_csv, load_site, load_sites, prepare_client
    from edge_agent.forecast import load_local_model
    from edge_agent.live import gateway_table
    from edge_agent.models import CheckpointError, load_checkpoint

    try:
        if cfg is not None:
            table = gateway_table(cfg)
            model = load_local_model(cfg, table).eval()
            columns: list[str] = []
        else:
            model, columns = load_checkpoint(checkpoint)
            table = load_csv(csv) if csv else build_pool(load_sites()) if site == "pool" else load_site(site)
        if columns and list(table.columns) != columns:
            table = table.select(columns)
        if table.n_features != model.n_features:
            raise ValueError(f"the model reads {model.n_features} features, the data has {table.n_features}")
        return model, prepare_client(table, model.cfg.lookback, model.cfg.horizon)
    except (CheckpointError, DataError, ValueError) as err:
        fail(str(err))


@export_app.command("onnx")
@needs("export")
def export_onnx_command(
    out: Annotated[Path, typer.Option(help="folder for model.onnx (and the streaming graphs)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 64, allow_silent: AllowSilent = False,
) -> None:
    """Any backbone + QAP + head to ONNX; spiking backbones also as streaming graphs."""
    run_export("onnx", out, model_and_data(checkpoint, agent_config, site, csv), windows, allow_silent)


def run_export(fmt: str, out: Path, source: tuple[Forecaster, ClientData], windows: int, allow_silent: bool,
               **options: Any) -> None:
    """Export ``source``'s model in format ``fmt``, verified on its test windows, and print the report;
    a model the format cannot express, an artefact that does not reproduce it, or (without
    ``allow_silent``) a LIF layer silent on those windows (``export.silence``) fails the command
    before anything is written."""
    from export import exporter
    from export.contract import ExportMismatchError
    from export.lava_check import LavaUnavailableError
    from export.stack import UnsupportedLayerError

    model, data = source
    warning = silence_warning(fmt, model, data, windows, allow_silent)
    try:
        report = exporter(fmt)(model, out, data.test, windows, **options)
    except (UnsupportedLayerError, ExportMismatchError, LavaUnavailableError) as err:
        fail(f"{fmt} export refused: {err}")
    for line in report_lines(report):
        console.print(line, markup=False)
    if warning:
        say(f"warning: {warning}")


def silence_warning(fmt: str, model: Forecaster, data: ClientData, windows: int, allow_silent: bool) -> str | None:
    """The silence rule on the windows the export verifies on: None when every LIF layer fired,
    the warning to print when ``allow_silent``, else the command fails naming the layers."""
    from export.contract import sample_windows
    from export.silence import lif_rates, silence_line, silent_layers

    try:
        x, marks = sample_windows(data.test, windows)
    except ValueError as err:
        fail(f"{fmt} export refused: {err}")
    silent = silent_layers(lif_rates(model, x, marks))
    if not silent:
        return None
    line = f"{silence_line(silent, len(x))} (a silent layer forwards nothing, and any export agrees with it)"
    if not allow_silent:
        fail(f"{fmt} export refused: {line}; nothing written (train longer, check other windows, or "
             f"--allow-silent to export it anyway)")
    return f"{line}; exported anyway (--allow-silent)"


def report_lines(report: ExportReport) -> list[str]:
    """Any exporter's report as text: files, verification figures, layers, firing rates, timings, notes."""
    checked = [f"verified on {report.windows} real test windows", *headline(report)]
    lines = [f"wrote {name}" for name in report.files] + ["; ".join(checked)]
    lines += [f"  {layer['name']}: {pairs(layer, skip='name')}" for layer in report.layers]
    if report.firing_rates:
        lines.append(f"firing rates: {pairs(report.firing_rates)}")
    if report.timings_ms:
        lines.append(f"ms per batch of {report.windows}: {pairs(report.timings_ms)}")
    return lines + [f"note: {note}" for note in report.notes]


def headline(report: ExportReport) -> list[str]:
    """The figures a report has: spike agreement, forecast error, steps, then its format's details."""
    figures = [] if report.spike_agreement is None else [f"spikes {report.spike_agreement:.4%} identical"]
    if report.max_abs_error is not None:
        figures.append(f"forecast max |error| {report.max_abs_error:.2e}")
    if report.steps is not None:
        figures.append(f"{report.steps} steps")
    return figures + ([pairs(report.details)] if report.details else [])


def pairs(values: dict[str, Any], skip: str = "") -> str:
    """``key value, key value`` for every key but ``skip``."""
    return ", ".join(f"{key} {show(value)}" for key, value in values.items() if key != skip)


def show(value: Any) -> str:
    """A report value as text: floats to four significant digits, lists in parentheses."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return f"({', '.join(map(show, value))})" if isinstance(value, list) else str(value)


def energy_command(
    out: Annotated[Path, typer.Option(help="folder for energy.md, energy.json and energy.png")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    profile: Annotated[list[str], typer.Option(help="hardware profile name or TOML file (repeatable)")] = ["cmos45nm"],
    precision: Annotated[Optional[str], typer.Option(help="arithmetic precision (default: each profile's)")] = None,
    host: Annotated[Optional[str], typer.Option(
        help="profile pricing what a neuromorphic target leaves off-chip (default: listed, not priced)")] = None,
) -> None:
    """Count MACs/ACs per layer on real test windows and price them per hardware target; a
    neuromorphic target runs exactly the stack ``export lava``/``export nir`` deploy."""
    from export.profiles import ProfileError, load_profile

    try:
        profiles = [load_profile(name) for name in profile]
        off_chip_host = load_profile(host) if host else None
    except ProfileError as err:
        fail(str(err))
    model, data = model_and_data(checkpoint, agent_config, site, csv)
    from export.energy import chip_layers, energy_report
    from export.opcount import count_ops
    from export.report import notices, write

    try:
        layers, windows = count_ops(model, data.test)
        reports = [energy_report(layers, windows, p, precision, chip_layers(model, p), off_chip_host) for p in profiles]
    except (ProfileError, NotImplementedError, ValueError) as err:
        fail(str(err))
    labels = [f"{report.profile} ({report.precision})" for report in reports]
    for label, report in zip(labels, reports):
        unpriced = f"; not priced: {', '.join(report.unpriced)}" if report.unpriced else ""
        off_chip = f" + {report.host_pj:.4g} pJ off-chip on {report.host}" if report.host else ""
        console.print(f"{label:>{max(map(len, labels))}}: {report.chip_pj:.4g} pJ per forecast on the target "
                      f"(priced ops){off_chip}, backbone {report.backbone_pj:.4g} pJ{unpriced}")
    for line in notices(reports):
        say(f"warning: {line}")
    for path in write(out, f"{model.cfg.backbone} on {data.name}", reports):
        console.print(f"wrote {path}")


@export_app.command("nir")
@needs("export")
def export_nir_command(
    out: Annotated[Path, typer.Option(help="NIR file to write (HDF5, e.g. model.nir)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 256, allow_silent: AllowSilent = False,
) -> None:
    """A spiking backbone's Dense + LIF stack to a NIR graph, read back and simulated to match."""
    run_export("nir", out, model_and_data(checkpoint, agent_config, site, csv), windows, allow_silent)


@export_app.command("lava")
@needs("export")
def export_lava_command(
    out: Annotated[Path, typer.Option(help="netx HDF5 file to write (e.g. model.net)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 64,
    min_agreement: Annotated[float, typer.Option(help="fail below this spike agreement with the quantized model")] = 0.99,
    verify_in_lava: Annotated[bool, typer.Option(
        help="also run the file in Lava's own fixed-point simulator (venv from `make lava-venv`)")] = False,
    lava_venv: Annotated[Path, typer.Option(help="the Lava venv for --verify-in-lava")] = Path(".lava-venv"),
    lava_windows: Annotated[int, typer.Option(help="windows Lava runs (its simulator is slow)")] = 8,
    allow_silent: AllowSilent = False,
) -> None:
    """A spiking backbone's Dense + LIF stack to Lava netx HDF5, checked by a fixed-point CUBA model
    (and, with --verify-in-lava, by Lava itself)."""
    run_export("lava", out, model_and_data(checkpoint, agent_config, site, csv), windows, allow_silent,
               min_agreement=min_agreement,
               lava_venv=lava_venv if verify_in_lava else None, lava_windows=lava_windows)
