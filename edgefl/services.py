"""``edgefl coordinator ...``, ``edgefl aggregator ...`` and ``edgefl agent ...``: the long-running services."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from edge_agent.toml_config import ConfigError, load_config
from edge_agent.data import DataError
from edge_agent.candidates import quality, served_name
from edge_agent.refusals import REFUSED_EXIT_CODE, Refused
from edge_agent.storage import StateDirError
from edgefl.errors import LazyConsole, escape, fail, say
from edgefl.extras import needs, require_installed
from edgefl.service_run import CONFIG_FLAGS, Stopper, serve_agent, setup_logging

console = LazyConsole(stderr=True)  # rich is loaded by the commands that print
coordinator_app = typer.Typer(help="The coordinator service.", no_args_is_help=True)
aggregator_app = typer.Typer(help="A site aggregator next to a site broker.", no_args_is_help=True)
agent_app = typer.Typer(help="The edge agent on a gateway.", no_args_is_help=True)
ConfigPath = Annotated[Path, typer.Option(*CONFIG_FLAGS, help="TOML configuration file")]
BUNDLE_WRITER = "export.bundle:write_bundle"  # imported by the round's child: the agent never loads torch
CHILD_LIBRARIES = ("torch", "statsforecast")  # what the agent's child processes import, checked at its start


def _print_event(kind: str, data: dict) -> None:
    """One plain line per event worth a look (``Console.out``: no markup or highlighting to parse,
    which at a thousand registrations a round was a large share of the coordinator's time)."""
    if kind == "closed":
        line = (f"round {data['round']:>3} closed: {data['accepted']} accepted, {data['rejected']} rejected, "
                f"loss {data['loss']:.4f} ({data['why']})")
    elif kind == "foundation":
        line = f"round {data['round']}: foundation checkpoint {data['path']} (sha256 {data['sha256']})"
    elif kind == "sent":
        line = f"round {data['round']}: site update sent up ({data['n_samples']} samples)"
    elif kind in ("rejected", "resumed", "registered", "revoked", "campaign", "cleared", "ignored", "standby",
                  "leading", "delivered", "refused") or (kind == "presence" and not data["online"]):
        line = f"{kind}: {data}"
    else:
        return
    console.out(line, highlight=False)


def _load(config: Path, settings: type):
    """``config`` as ``settings``; a bad file ends the command with the error naming it."""
    try:
        return load_config(config, settings)
    except ConfigError as err:
        fail(str(err))


HttpOption = Annotated[Optional[str], typer.Option(
    "--http", metavar="HOST:PORT",
    help="serve the dashboard, JSON API and /metrics here (instead of the config's http table)")]


def _service_config(config: Path, verbose: bool, http: str | None, settings: type):
    """``config`` loaded as ``settings``, ``--http`` applied; bad input ends the command (before the
    service, which loads torch, is imported)."""
    from coordinator.observe.settings import HttpSettings

    setup_logging(verbose)
    cfg = _load(config, settings)
    if http is not None:
        try:
            cfg = cfg.model_copy(update={"http": HttpSettings.parse_address(http, cfg.http)})
        except ValueError as err:
            fail(str(err))
    return cfg


def _serve(cfg, config: Path, service: type) -> None:
    """Take the lead of ``cfg``'s store (at once on SQLite; on PostgreSQL once the lease is ours)
    and run ``service`` until it ends or is stopped."""
    from coordinator.lease import take_lead
    from coordinator.server import FINISHED_EXIT_CODE, CampaignFinished
    from coordinator.store_backends import LeaseLost

    stop = Stopper()
    try:
        store = take_lead(cfg, stop, _print_event)
        if store is not None:
            service(cfg, on_event=_print_event, store=store, config_path=config).serve(stop=stop)
    except (ConnectionError, StateDirError) as err:
        fail(str(err))
    except LeaseLost as err:
        fail(f"{err}; stopped (a standby coordinator takes over)")
    except Refused as err:
        fail(str(err), REFUSED_EXIT_CODE)
    except CampaignFinished as err:
        fail(str(err), FINISHED_EXIT_CODE)


@coordinator_app.command("serve")
@needs("coordinator")
def coordinator_serve(config: ConfigPath, verbose: bool = False, http: HttpOption = None) -> None:
    """Run the rounds of a fleet until the last one is aggregated (resumes after a crash)."""
    from coordinator.config import CoordinatorConfig

    cfg = _service_config(config, verbose, http, CoordinatorConfig)
    from coordinator.server import Coordinator

    _serve(cfg, config, Coordinator)


@aggregator_app.command("serve")
@needs("coordinator")
def aggregator_serve(config: ConfigPath, verbose: bool = False, http: HttpOption = None) -> None:
    """Serve the central coordinator's rounds to this site's gateways and send one combined update
    per round up the bridge (resumes after a crash)."""
    from coordinator.config import AggregatorConfig

    cfg = _service_config(config, verbose, http, AggregatorConfig)
    from coordinator.site import SiteAggregator

    _serve(cfg, config, SiteAggregator)


@coordinator_app.command("status")
@needs("coordinator")
def coordinator_status(config: ConfigPath) -> None:
    """Print the rounds, clients and rejections recorded in the coordinator's state."""
    from coordinator.config import CoordinatorConfig

    _print_status(_load(config, CoordinatorConfig))


@aggregator_app.command("status")
@needs("coordinator")
def aggregator_status(config: ConfigPath) -> None:
    """Print the site's rounds (as the central coordinator numbered them), its gateways and rejections."""
    from coordinator.config import AggregatorConfig

    _print_status(_load(config, AggregatorConfig))


def _print_status(cfg) -> None:
    """The rounds, clients and latest rejections in a coordinator's (or site aggregator's) state."""
    from rich.console import Console
    from rich.table import Table

    from coordinator.config import SQLITE_FILE

    if cfg.store.url is None and not (Path(cfg.state_dir) / SQLITE_FILE).exists():
        fail(f"state_dir {cfg.state_dir}: no coordinator state there ({SQLITE_FILE} is missing); check state_dir in "
             "the config, or start the coordinator (coordinator serve) first")
    from coordinator.store import Store

    try:
        store = Store(cfg.state_dir, cfg.store.url)
    except StateDirError as err:
        fail(str(err))
    rounds = Table("round", "state", "updates", "late", "imputed", "dropped", "loss", "closed by",
                   title=f"fleet {cfg.fleet}, campaign {store.campaign()}")
    for row in store.rounds():
        on_time, received = len(store.updates(row.round)), len(store.updates(row.round, include_late=True))
        rounds.add_row(
            str(row.round), "closed" if row.closed_at else "open", str(on_time), str(received - on_time),
            _stand_ins(row.metrics),
            ", ".join(row.metrics.get("dropped", [])) or "-",
            f"{row.metrics['loss']:.4f}" if row.metrics else "-", row.metrics.get("closed_by", "-"),
        )
    Console().print(rounds)
    clients = Table("client", "features", "samples", "online", "last seen", "last round")
    last, latest = store.last_reported(), store.latest_metrics()
    for client in store.clients().values():
        clients.add_row(client.client_id, str(client.n_features), str(client.n_samples), str(client.online),
                        _ago(client.last_seen), str(last.get(client.client_id, "-")))
    Console().print(clients)
    for client in store.clients().values():  # a line each: readable at any width
        Console().print(f"{client.client_id} serves {_serves(latest.get(client.client_id, {}))}", soft_wrap=True)
    if cfg.store.url is not None:
        from coordinator.lease import leader_of
        from coordinator.store_postgres import where

        Console().print(f"store {where(cfg.store.url)}: fleet {cfg.fleet} is led by "
                        f"{leader_of(store, cfg.fleet) or 'no coordinator'}", soft_wrap=True)
    for event in store.events(accepted=False)[-10:]:
        Console().print(f"rejected {event['kind']} from {event['client_id']} (round {event['round']}): {event['reason']}")


def _stand_ins(metrics: dict) -> str:
    """Who stood in for a round's missing clients: twins (named by forecaster) and late updates."""
    parts = [f"{', '.join(metrics['imputed'])} ({metrics['twin']})"] if metrics.get("imputed") else []
    if metrics.get("stale"):
        parts.append(f"{', '.join(metrics['stale'])} (late update)")
    return "; ".join(parts) or "-"


def _ago(at: float | None) -> str:
    """When a client was last heard from: UTC time (with the date unless today) and how long ago."""
    if at is None:
        return "-"
    seconds = max(0, int(time.time() - at))
    age = f"{seconds} s" if seconds < 120 else f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"
    today = time.gmtime(at)[:3] == time.gmtime()[:3]
    return f"{time.strftime('%H:%M:%S' if today else '%Y-%m-%d %H:%M', time.gmtime(at))}Z ({age} ago)"


def _serves(metrics: dict) -> str:
    """Which model a gateway said it serves, and where it chooses among several (``keep_local``,
    ``anchors``) its validation MASE beside its best anchor's, as the dashboard shows them:
    "median (val MASE 0.790; best anchor seasonal_naive 0.791, -0.1%)"."""
    row = quality(metrics)
    if row is None or row["serves"] is None or row["served"] is None:
        return served_name(metrics) or "federated"
    served = f"{row['serves']} (val MASE {row['served']:.3f}"
    if row["best_anchor"] is None or not row["anchor"]:
        return served + ")"
    return (f"{served}; best anchor {row['best_anchor']} {row['anchor']:.3f}, "
            f"{row['served'] / row['anchor'] - 1:+.1%})")


def _agent_config(config: Path):
    from edge_agent.config import AgentConfig

    return _load(config, AgentConfig)


def _print_agent_event(kind: str, data: dict) -> None:
    if kind == "sent":
        console.print(f"round {data['round']}: trained, loss {data['loss']:.4f}, update sent")
    elif kind == "personal":
        console.print(f"round {data['round']}: personalized update received")


@agent_app.command("run")
@needs("gateway")
def agent_run(config: ConfigPath, verbose: bool = False) -> None:
    """Train for every announced round and send the shared parameters to the coordinator."""
    setup_logging(verbose)
    cfg = _agent_config(config)
    require_installed(*CHILD_LIBRARIES)
    from edge_agent.agent import Agent

    try:
        agent = Agent(cfg, on_event=_print_agent_event, write_bundle=BUNDLE_WRITER)
    except (DataError, ValueError, StateDirError) as err:
        fail(str(err))
    for note in agent.facts.notes if agent.facts is not None else []:
        say(note)
    try:
        agent.run(stop=Stopper())
    except Refused as err:
        fail(str(err), REFUSED_EXIT_CODE)


@agent_app.command("serve")
def agent_serve(config: ConfigPath, verbose: bool = False) -> None:
    """Serving only: ingest the sensors and publish forecasts from the latest ONNX bundle in
    state_dir/serving on the serving table's schedule, reloading it when the training agent writes
    a new one. Reads only client_id, state_dir and the data, sensors and serving tables; never
    loads torch."""
    serve_agent(config, verbose)


@agent_app.command("forecast")
@needs("gateway")
def agent_forecast(
    config: ConfigPath,
    csv: Annotated[bool, typer.Option("--csv", help="print CSV instead of a table (with every level)")] = False,
    onnx: Annotated[Optional[Path], typer.Option(help="run this exported model.onnx in ONNX Runtime")] = None,
    conformal: Annotated[bool, typer.Option(
        "--conformal", help="a quantile model's interval calibrated on this gateway's validation windows")] = False,
) -> None:
    """Print the forecast of the local model for the horizon after the latest window; a quantile
    model's with its interval (lowest to highest level). Before any training: what the gateway
    would serve by its rule (an anchor, or the fleet's model once received), saying so."""
    import logging

    cfg = _agent_config(config)
    from edge_agent.forecast import forecast
    from edgefl.forecast_view import print_forecast
    from edgefl.progress import heartbeat

    stages = logging.getLogger("edgefl.agent")  # what edge_agent.forecast is doing, as plain lines
    stages.setLevel(logging.INFO)
    stages.addHandler(logging.StreamHandler())
    try:
        with heartbeat(lambda line: console.print(line, soft_wrap=True), f"{cfg.client_id}: forecast"):
            result = forecast(cfg, onnx, conformal)
    except (DataError, ValueError) as err:
        fail(str(err))
    console.print(f"{cfg.client_id}: forecast by {result.served_by}", soft_wrap=True)
    if result.interval:
        console.print(f"{cfg.client_id}: {result.interval}", soft_wrap=True)
    if csv:
        print("\n".join(result.csv_lines()))
        return
    print_forecast(cfg.client_id, result, console.width)


@agent_app.command("checkpoint")
@needs("gateway")
def agent_checkpoint(
    config: ConfigPath, out: Annotated[Path, typer.Option("--out", "-o", help="checkpoint file to write")]
) -> None:
    """Save the agent's current model (global shared + personal parts) as one checkpoint file."""
    from rich.console import Console

    cfg = _agent_config(config)
    from edge_agent.forecast import load_local_model
    from edge_agent.live import gateway_table
    from edge_agent.models import save_checkpoint

    try:
        table = gateway_table(cfg)
        model = load_local_model(cfg, table)
    except (DataError, ValueError) as err:
        fail(str(err))
    save_checkpoint(model, out, list(table.columns))
    Console().print(f"wrote {out} ({cfg.model.backbone}, {table.n_features} features)")
