"""``edgefl pretrain``: the foundation model pretrained by masked reconstruction, federated over
the bundled weather sites. Its settings are declared once, by the fields of PretrainConfig and
FoundationConfig (``edgefl.model_options``); loaded only when run (``edgefl.root``), and its flags
are checked before the data (pandas, pvlib) and torch load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from coordinator.simulation.pretrain_config import PretrainConfig
from edge_agent.data import DataError
from edge_agent.models.foundation_config import FoundationConfig
from edgefl.errors import LazyConsole, flags_of, reported
from edgefl.extras import needs
from edgefl.model_options import ModelOptions
from edgefl.root import COORDINATOR

app = typer.Typer()
console = LazyConsole()
OPTIONS = ModelOptions({
    PretrainConfig: ("strategy", "rounds", "local_epochs", "participation", "stride", "seed"),
    FoundationConfig: ("window",),
}, names={})


def pretrain(
    out: Annotated[Path, typer.Option(help="foundation checkpoint to write")] = Path("runs/foundation.safetensors"),
    paper_sizes: Annotated[bool, typer.Option(help="d_model 256, 4 layers, 8 heads (Table 9)")] = False,
    steps: Annotated[str, typer.Option(help="resolutions of every site in the fleet, e.g. 1h,3h,6h "
                                       "(mean per interval)")] = "1h",
    per_variable: Annotated[bool, typer.Option(help="also one client per measured variable of every site")] = False,
    extra_series: Annotated[bool, typer.Option(help="also pvlib's other real series: Craig CO every 30 min and "
                                               "hourly rain + particulates (adds their quantities to the model)")] = False,
    **settings: Any,
) -> None:
    """Pretrain the foundation model by masked reconstruction, federated over the weather sites
    (with --steps, --per-variable and --extra-series: a fleet that mixes resolutions and quantities;
    the papers' settings: 20 rounds of 20 local epochs, participation 0.5)."""
    with reported(DataError, ValueError, flags={**OPTIONS.flags, **flags_of("steps")}):
        resolutions = checked_steps(steps)
        from edge_agent.data.variables import EXTRA_VARIABLES, WEATHER_VARIABLES

        variables = WEATHER_VARIABLES + (EXTRA_VARIABLES if extra_series else ())
        fm = (FoundationConfig.paper if paper_sizes else FoundationConfig)(
            **OPTIONS.values(FoundationConfig, settings), variables=variables)
        cfg = PretrainConfig(**OPTIONS.values(PretrainConfig, settings))
        devices = fleet_devices(fm, cfg, resolutions, per_variable, extra_series)
    train(devices, fm, cfg, out)


def checked_steps(steps: str) -> list[str]:
    """``--steps`` as a list of durations, each checked before the data and torch load."""
    from edge_agent.times import parse_duration

    resolutions = [s.strip() for s in steps.split(",")]
    for step in resolutions:
        try:
            parse_duration(step)
        except ValueError as err:
            raise ValueError(f"--steps: {err}") from None
    return resolutions


def fleet_devices(fm: FoundationConfig, cfg: PretrainConfig, resolutions: list[str], per_variable: bool,
                  extra_series: bool) -> list:
    """Every pretraining device: the weather sites at each resolution (one per measured variable
    too with ``per_variable``), plus pvlib's other series with ``extra_series``."""
    from edge_agent.data import load_sites
    from edge_agent.data.canonical import device_series
    from edge_agent.data.extra import extra_series as load_extra
    from edge_agent.data.resample import mixed_fleet

    fleet = mixed_fleet(load_sites(), resolutions, per_variable)
    fleet += load_extra() if extra_series else []
    return [device_series(table, fm.variables, fm.window, cfg.stride) for table in fleet]


def train(devices: list, fm: FoundationConfig, cfg: PretrainConfig, out: Path) -> None:
    """The federated pretraining, a table row per round, and the checkpoint with its hash."""
    from rich.live import Live
    from rich.table import Table

    from coordinator.simulation.pretrain import pretrain as run_pretraining
    from edge_agent.models.foundation import save_foundation

    table = Table("round", "devices", "train loss", "val masked MSE", "seconds",
                  title=f"foundation pretraining ({cfg.strategy})")
    with Live(table, console=console.rich, refresh_per_second=4):
        model, _ = run_pretraining(devices, fm, cfg, lambda r: table.add_row(
            str(r.round), shown_devices(r.devices, len(devices)), f"{r.train_loss:.4f}", f"{r.val_loss:.4f}",
            f"{r.seconds:.1f}"))
    digest = save_foundation(model, out)
    console.print(f"\nwrote {out} (sha256 {digest})", soft_wrap=True)


def shown_devices(names: tuple[str, ...], fleet: int, shown: int = 6) -> str:
    """The devices of a round by name, or how many of the fleet where names would not fit."""
    return ", ".join(names) if len(names) <= shown else f"{len(names)} of {fleet}"


pretrain.__signature__ = OPTIONS.signature(pretrain)
app.command(rich_help_panel=COORDINATOR)(needs("coordinator")(pretrain))
