"""The ``edgefl`` command line as a typer app: every command (``edgefl.cli`` runs it, and runs
``agent serve`` without it)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from edge_agent.data import DataError
from edgefl.errors import LazyConsole, fail, flags_of, reported, say
from edgefl.export_cli import energy_command, export_app
from edgefl.extras import needs
from edgefl.replay import replay_command
from edgefl.root import COORDINATOR, EXPORT, GATEWAY, START, RootGroup
from edgefl.services import agent_app, aggregator_app, coordinator_app

app = typer.Typer(
    help="edgefl: federated time-series forecasting on edge devices.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=RootGroup,
)
console = LazyConsole()  # rich is loaded by the commands that print tables
app.add_typer(coordinator_app, name="coordinator", rich_help_panel=COORDINATOR)
app.add_typer(aggregator_app, name="aggregator", rich_help_panel=COORDINATOR)
app.add_typer(agent_app, name="agent", rich_help_panel=GATEWAY)
app.add_typer(export_app, name="export", rich_help_panel=EXPORT)
app.command("energy", rich_help_panel=EXPORT)(needs("export")(energy_command))
app.command("replay", rich_help_panel=GATEWAY)(needs("gateway")(replay_command))


@app.command(rich_help_panel=START)
@needs("sites")
def sites() -> None:
    """List the real weather sites bundled with pvlib (one device each)."""
    from rich.table import Table

    from edge_agent.data import list_sites, load_site

    table = Table("site", "latitude", "longitude", "rows", "variables")
    for name in list_sites():
        site = load_site(name)
        table.add_row(
            name, f"{site.latitude:.3f}", f"{site.longitude:.3f}", str(site.n_rows), " ".join(site.columns)
        )
    console.print(table)


@app.command(rich_help_panel=START)
@needs("all")
def demo(
    rounds: Annotated[int, typer.Option(help="rounds to run")] = 5,
    out: Annotated[Path, typer.Option(help="working folder (configs, state, logs, pictures)")] = Path("runs/demo"),
    stations: Annotated[Optional[int], typer.Option(min=1, help="how many bundled weather stations join "
                                                    "(default: all 7)")] = None,
) -> None:
    """A real fleet on this machine: mosquitto, the coordinator and one agent per weather site;
    each start-up stage and round as it happens, then pictures of the rounds and forecasts."""
    import shutil
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from edgefl.demo import configure, look_next, round_cells, round_table, run_demo
    from edgefl.demo_plots import plot_curve, plot_forecasts, station_days
    from edgefl.progress import live_rounds

    shutil.rmtree(out, ignore_errors=True)
    note = functools.partial(console.print, soft_wrap=True, markup=False, highlight=False)
    try:
        fleet = configure(out, rounds, stations)
        note(f"starting mosquitto, the coordinator and {len(fleet.sites)} agents (logs in {fleet.logs}) ...")
        with live_rounds(console.rich, round_table(len(fleet.sites))) as show:
            rows = run_demo(fleet, rounds, note, lambda r: show(round_cells(r)))
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        fail(str(exc))
    curve, forecasts = out / "training_curve.png", out / "forecasts.png"
    plot_curve(rows, curve)
    note(f"forecasting each station's last test days with the model it serves (from {out / 'state'}) ...")
    drawn = []
    configs = [fleet.agent_config(site) for site in fleet.sites]
    with ProcessPoolExecutor(min(len(configs), os.cpu_count() or 1), mp_context=get_context("spawn")) as pool:
        for site, days in zip(fleet.sites, pool.map(station_days, configs)):  # each fits its anchors: seconds
            drawn.append(days)
            note(f"  {site}: served by {days.served}")
    plot_forecasts(drawn, forecasts)
    note("\n".join(look_next(fleet, curve, forecasts)))


@app.command("init", rich_help_panel=START)
def init_command(
    folder: Annotated[Path, typer.Argument(help="the fleet folder to create (new or empty)")],
    fleet: Annotated[str, typer.Option(help="fleet name (topic prefix edgefl/<fleet>/)")] = "farm",
    agents: Annotated[int, typer.Option(min=1, max=999, help="number of agents (agent01, agent02, ...)")] = 3,
    rounds: Annotated[int, typer.Option(min=1, help="rounds of the campaign")] = 10,
    round_timeout_s: Annotated[float, typer.Option(min=1, help="deadline of a round after its announcement")] = 300.0,
    host: Annotated[str, typer.Option(help="address the broker listens on and the services connect to")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="the broker's port")] = 1883,
) -> None:
    """Create a fleet folder that runs as it is: broker config, coordinator.toml, one agent.toml
    per gateway (with [model]), systemd units; prints the commands that start it."""
    from edgefl.init_fleet import closed_parents, init_fleet, instructions

    with reported(ValueError, OSError, flags=flags_of("fleet")):
        written = init_fleet(folder, fleet, agents, rounds, host, port, round_timeout_s)
    for parent in closed_parents(written.folder):
        say(f"warning: {parent} is closed to other users: the broker (user mosquitto) cannot reach its files; "
            f"chmod o+x {parent} or choose a folder it can enter")
    console.print("\n".join(instructions(written)), soft_wrap=True, markup=False, highlight=False)


@app.command("broker-config", rich_help_panel=COORDINATOR)
@needs("coordinator")
def broker_config(
    fleet: Annotated[str, typer.Option(help="fleet name (topic prefix edgefl/<fleet>/)")],
    out: Annotated[Path, typer.Option(help="folder to write the setup into")],
    agents: Annotated[int, typer.Option(help="number of agents (named agent01, agent02, ...)")] = 3,
    names: Annotated[Optional[str], typer.Option(help="comma-separated agent ids instead of agent01..")] = None,
    host: str = "127.0.0.1",
    port: int = 1883,
    tls: Annotated[bool, typer.Option(help="create a CA and a server certificate and listen with TLS")] = False,
    max_payload_bytes: Annotated[Optional[int], typer.Option(
        min=1024, help="largest message the services accept (the broker's max_packet_size: this plus 1 KiB of MQTT "
                       "headers; default: the largest legal update of the fleet's model)",
    )] = None,
    sites: Annotated[Optional[str], typer.Option(
        help="central setup: comma-separated site ids whose aggregators bridge in (credentials in OUT/sites/)")] = None,
    site: Annotated[Optional[str], typer.Option(help="write a site broker and aggregator for this site id")] = None,
    uplink: Annotated[Optional[str], typer.Option(help="with --site: the central broker as HOST[:PORT]")] = None,
    central: Annotated[Optional[Path], typer.Option(help="with --site: the central setup folder (its sites/)")] = None,
) -> None:
    """Write a mosquitto config, password file and ACL for a fleet, plus every service's config;
    with --site, a site broker bridged to the central one and its aggregator's config."""
    from coordinator.broker_setup import write_fleet_setup
    from coordinator.site_setup import write_site_setup

    ids = [n.strip() for n in names.split(",")] if names else [f"agent{i:02d}" for i in range(1, agents + 1)]
    site_ids = [n.strip() for n in sites.split(",")] if sites else []
    if site is not None and (uplink is None or central is None):
        fail("--site needs --uplink HOST[:PORT] and --central FOLDER (the central setup written with --sites)")
    try:
        written = (write_site_setup(fleet, site, ids, out, uplink, central, host, port, tls, max_payload_bytes)
                   if site is not None else
                   write_fleet_setup(fleet, ids, out, host, port, tls, max_payload_bytes=max_payload_bytes,
                                     sites=site_ids))
    except ValueError as exc:
        fail(str(exc))
    for name, path in written.items():
        console.print(f"wrote {path}")
    service = (f"start the aggregator:  edgefl aggregator serve --config {written['aggregator.toml']}" if site
               else f"start the coordinator: edgefl coordinator serve --config {written['coordinator.toml']}")
    console.print(f"\nstart the broker:     mosquitto -c {written['mosquitto.conf']}\n{service}")
    if ids:
        console.print(f"start an agent:        edgefl agent run --config {written[ids[0] + '.toml']}")
