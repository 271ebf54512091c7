"""``edgefl export ...``: a trained client model to ONNX, Lava netx or NIR, verified on real windows."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from edge_agent.data import ClientData, DataError, build_pool, load_csv, load_site, load_sites, prepare_client
from edge_agent.models import CheckpointError, Forecaster, load_checkpoint

console = Console(soft_wrap=True)
export_app = typer.Typer(help="Export a trained model: ONNX, Lava netx HDF5, NIR.", no_args_is_help=True)

Checkpoint = Annotated[Optional[Path], typer.Option(help="model file (edgefl simulate --save-models, agent checkpoint)")]
AgentConfigPath = Annotated[Optional[Path], typer.Option("--agent-config", help="use this agent's model and data")]
Site = Annotated[Optional[str], typer.Option(help="bundled weather site (or 'pool': all sites) to verify on")]
Csv = Annotated[Optional[Path], typer.Option("--csv", help="CSV whose windows verify the export")]
Windows = Annotated[int, typer.Option(help="real test windows used to verify the export")]


def fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


def model_and_data(
    checkpoint: Path | None, agent_config: Path | None, site: str | None, csv: Path | None
) -> tuple[Forecaster, ClientData]:
    """The model to export and the data whose held-out windows verify it (same features)."""
    from edge_agent.config import AgentConfig, ConfigError, load_config
    from edge_agent.forecast import load_local_model

    try:
        if agent_config is not None:
            cfg = load_config(agent_config, AgentConfig)
            table = cfg.data.load()
            model = load_local_model(cfg, table).eval()
            columns: list[str] = []
        elif checkpoint is not None and (site is None) != (csv is None):
            model, columns = load_checkpoint(checkpoint)
            table = load_csv(csv) if csv else build_pool(load_sites()) if site == "pool" else load_site(site)
        else:
            raise ValueError("give --agent-config, or --checkpoint with one of --site / --csv")
        if columns and list(table.columns) != columns:
            table = table.select(columns)
        if table.n_features != model.n_features:
            raise ValueError(f"the model reads {model.n_features} features, the data has {table.n_features}")
        return model, prepare_client(table, model.cfg.lookback, model.cfg.horizon)
    except (ConfigError, CheckpointError, DataError, ValueError) as err:
        fail(str(err))
        raise  # unreachable: fail exits


@export_app.command("onnx")
def export_onnx_command(
    out: Annotated[Path, typer.Option(help="folder for model.onnx (and the streaming graphs)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 64,
) -> None:
    """Any backbone + QAP + head to ONNX; spiking backbones also as streaming graphs."""
    from export.onnx import ExportMismatch, export_onnx

    model, data = model_and_data(checkpoint, agent_config, site, csv)
    try:
        report = export_onnx(model, out, data.test, windows)
    except ExportMismatch as err:
        fail(f"ONNX Runtime does not reproduce the model: {err}")
    for name in report.files:
        console.print(f"wrote {out / name}")
    line = f"verified on {report.windows} real test windows: forecast max |error| {report.max_abs_error:.2e}"
    if report.spikes_checked:
        line += (f"; {report.spikes_checked} spikes, {report.spike_agreement:.4%} identical "
                 f"({report.flipped_windows} window{'' if report.flipped_windows == 1 else 's'} with a spike "
                 "flipped at a float32 threshold tie left out "
                 f"of the forecast check); streaming max |error| {report.stream_max_abs_error:.2e}")
    console.print(line)
    timing = report.timings_ms
    console.print(f"batch of {timing['batch']}: torch {timing['torch_ms']:.2f} ms, ONNX Runtime {timing['onnx_ms']:.2f} ms")


def energy_command(
    out: Annotated[Path, typer.Option(help="folder for energy.md, energy.json and energy.png")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    profile: Annotated[list[str], typer.Option(help="hardware profile name or TOML file (repeatable)")] = ["cmos45nm"],
    precision: Annotated[Optional[str], typer.Option(help="arithmetic precision (default: each profile's)")] = None,
) -> None:
    """Count MACs/ACs per layer on real test windows and price them per hardware target."""
    from export.energy import energy_report
    from export.opcount import count_ops
    from export.profiles import ProfileError, load_profile
    from export.report import write

    model, data = model_and_data(checkpoint, agent_config, site, csv)
    try:
        profiles = [load_profile(name) for name in profile]
        layers, windows = count_ops(model, data.test)
        reports = [energy_report(layers, windows, p, precision) for p in profiles]
    except (ProfileError, NotImplementedError, ValueError) as err:
        fail(str(err))
    labels = [f"{report.profile} ({report.precision})" for report in reports]
    for label, report in zip(labels, reports):
        unpriced = f"; not priced: {', '.join(report.unpriced)}" if report.unpriced else ""
        console.print(f"{label:>{max(map(len, labels))}}: {report.total_pj:.4g} pJ per forecast (priced ops), "
                      f"backbone {report.backbone_pj:.4g} pJ{unpriced}")
    for path in write(out, f"{model.cfg.backbone} on {data.name}", reports):
        console.print(f"wrote {path}")


@export_app.command("nir")
def export_nir_command(
    out: Annotated[Path, typer.Option(help="NIR file to write (HDF5, e.g. model.nir)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 256,
) -> None:
    """A spiking backbone's Dense + LIF stack to a NIR graph, read back and simulated to match."""
    from export.nir import ExportMismatchError, export_nir
    from export.stack import UnsupportedLayerError

    model, data = model_and_data(checkpoint, agent_config, site, csv)
    try:
        report = export_nir(model, out, data.test, limit=windows)
    except (UnsupportedLayerError, ExportMismatchError) as err:
        fail(str(err))
    rates = ", ".join(f"{name} {rate:.3f}" for name, rate in report["firing_rates"].items())
    console.print(f"wrote {out}: {len(report['layers'])} layers, read back with nir.read and simulated on "
                  f"{report['windows']} real windows; spike agreement {report['spike_agreement']:.4f}")
    console.print(f"firing rates: {rates}")


@export_app.command("lava")
def export_lava_command(
    out: Annotated[Path, typer.Option(help="netx HDF5 file to write (e.g. model.net)")],
    checkpoint: Checkpoint = None, agent_config: AgentConfigPath = None, site: Site = None, csv: Csv = None,
    windows: Windows = 64,
    min_agreement: Annotated[float, typer.Option(help="fail below this spike agreement with the quantized model")] = 0.99,
) -> None:
    """A spiking backbone's Dense + LIF stack to Lava netx HDF5, checked by a fixed-point CUBA model."""
    from export.lava import LavaMismatchError, export_lava
    from export.stack import UnsupportedLayerError

    model, data = model_and_data(checkpoint, agent_config, site, csv)
    try:
        report = export_lava(model, out, data.test, min_agreement, windows)
    except (UnsupportedLayerError, LavaMismatchError) as err:
        fail(str(err))
    console.print(f"wrote {out}: {len(report['layers'])} dense CUBA layers, {report['clipped_weights']} weights clipped; "
                  f"checked on {report['windows']} real windows x {report['steps']} steps")
    for layer in report["layers"]:
        name = layer["name"]
        console.print(f"  {name}: scale {layer['scale']:.2f}, agreement with quantized torch "
                      f"{report['agreement_quantized'][name]:.4f}, with float torch {report['agreement_float'][name]:.4f}, "
                      f"firing rate {report['firing_rates'][name]:.3f}")
    console.print(f"off-chip: {', '.join(report['off_chip'])}" + ("" if "lava" in report else
                  "; lava-dl not installed here, so the file was checked by the fixed-point model only"))
