"""The ``edgefl`` command line."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.table import Table

from edge_agent.data import DataError, GapPolicy
from edge_agent.mqtt import DEFAULT_MAX_PAYLOAD_BYTES
from edge_agent.recipe import MODEL as MODEL_DEFAULTS
from edge_agent.recipe import TRAINING as TRAINING_DEFAULTS
from edgefl.export_cli import energy_command, export_app
from edgefl.extras import needs
from edgefl.replay import replay_command
from edgefl.services import agent_app, aggregator_app, coordinator_app

if TYPE_CHECKING:
    from edge_agent.train import Metrics

app = typer.Typer(
    help="edgefl: federated time-series forecasting on edge devices.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
app.add_typer(coordinator_app, name="coordinator")
app.add_typer(aggregator_app, name="aggregator")
app.add_typer(agent_app, name="agent")
app.add_typer(export_app, name="export")
app.command("energy")(needs("export")(energy_command))
app.command("replay")(needs("gateway")(replay_command))


def fail(message: str) -> None:
    """Print a user-facing error and exit with status 2."""
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


@app.command()
@needs("sites")
def sites() -> None:
    """List the real weather sites bundled with pvlib (one device each)."""
    from edge_agent.data import list_sites, load_site

    table = Table("site", "latitude", "longitude", "rows", "variables")
    for name in list_sites():
        site = load_site(name)
        table.add_row(
            name, f"{site.latitude:.3f}", f"{site.longitude:.3f}", str(site.n_rows), " ".join(site.columns)
        )
    console.print(table)


@app.command()
@needs("all")
def demo(
    rounds: Annotated[int, typer.Option(help="rounds to run")] = 5,
    out: Annotated[Path, typer.Option(help="working folder (configs, state, logs, plot)")] = Path("runs/demo"),
) -> None:
    """A real fleet on this machine: mosquitto, the coordinator and one agent per weather site."""
    import shutil

    from edgefl.demo import plot_curve, run_demo

    shutil.rmtree(out, ignore_errors=True)
    table = Table("round", "clients", "accepted", "rejected", "train loss", "elapsed s",
                  title="edgefl fleet: 7 weather stations over MQTT")
    console.print(f"starting mosquitto, the coordinator and 7 agents (logs in {out / 'logs'}) ...")
    try:
        with Live(table, console=console, refresh_per_second=4):
            rows = run_demo(out, rounds, lambda r: table.add_row(
                str(r.round), str(r.clients), str(r.accepted), str(r.rejected), f"{r.loss:.4f}", f"{r.seconds:.1f}"))
        console.print()
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        fail(str(exc))
    plot_curve(rows, out / "training_curve.png")
    console.print(f"wrote {out / 'training_curve.png'}; coordinator state in {out / 'state' / 'coordinator'}")


@app.command("broker-config")
@needs("coordinator")
def broker_config(
    fleet: Annotated[str, typer.Option(help="fleet name (topic prefix edgefl/<fleet>/)")],
    out: Annotated[Path, typer.Option(help="folder to write the setup into")],
    agents: Annotated[int, typer.Option(help="number of agents (named agent01, agent02, ...)")] = 3,
    names: Annotated[Optional[str], typer.Option(help="comma-separated agent ids instead of agent01..")] = None,
    host: str = "127.0.0.1",
    port: int = 1883,
    tls: Annotated[bool, typer.Option(help="create a CA and a server certificate and listen with TLS")] = False,
    max_payload_bytes: Annotated[int, typer.Option(
        min=1024, help="largest message the broker accepts (message_size_limit) and the services expect",
    )] = DEFAULT_MAX_PAYLOAD_BYTES,
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


def round_table(quantiles: bool) -> Table:
    """The per-round table; quantile runs add the test split's QS, ICP and MIL (Fed-GAME Table 1)."""
    extra = ("test QS", "test ICP", "test MIL") if quantiles else ()
    return Table(
        "round", "train loss", "val score", "test MASE", "test MSE", *extra, "on time", "imputed", "serving",
        "kB/client", "seconds", title="FedPer rounds",
    )


def quantile_cells(metrics: Metrics | None) -> list[str]:
    """A quantile run's QS, ICP and MIL table cells (dashes where the split was not tested)."""
    if metrics is None:
        return ["-"] * 3
    return [f"{metrics.qs:.4f}", f"{metrics.icp:.3f}", f"{metrics.mil:.4f}"]


def quantile_summary(metrics: Metrics | None) -> dict[str, float]:
    """QS, ICP and MIL for the JSON summary, and the conformal-calibrated ICP and MIL where
    evaluated (empty for point models)."""
    if metrics is None or metrics.qs is None:
        return {}
    calibrated = {"icp_conformal": metrics.icp_conformal, "mil_conformal": metrics.mil_conformal}
    return {"qs": metrics.qs, "icp": metrics.icp, "mil": metrics.mil,
            **{k: v for k, v in calibrated.items() if v is not None}}


def metric_line(metrics: Metrics) -> str:
    """"test MSE .., MAE .." and, for quantile models, QS, ICP and MIL (and those of the
    conformal-calibrated intervals)."""
    extra = "".join(f", {name.upper().replace('_CONFORMAL', ' (conformal)')} {value:.4f}"
                    for name, value in quantile_summary(metrics).items())
    mase = "" if metrics.mase is None else f"MASE {metrics.mase:.4f}, "
    return f"test {mase}MSE {metrics.mse:.4f}, MAE {metrics.mae:.4f}{extra}"


def parse_levels(text: str | None) -> tuple[float, ...] | None:
    """``--quantiles 0.1,0.5,0.9`` -> (0.1, 0.5, 0.9); the levels themselves are checked by ModelConfig."""
    if text is None:
        return None
    try:
        return tuple(float(level) for level in text.split(","))
    except ValueError:
        raise ValueError(f"--quantiles: '{text}' is not a comma-separated list of numbers (e.g. 0.1,0.5,0.9)") from None


@app.command()
@needs("coordinator")
def simulate(
    backbone: Annotated[str, typer.Option(help="dlinear|itransformer|lstm|gru|spikernn|spikformer|ispikformer")] = "dlinear",
    rounds: Annotated[int, typer.Option(help="global rounds G")] = 10,
    local_epochs: Annotated[int, typer.Option(help="local epochs E per round")] = 1,
    clients: Annotated[int, typer.Option(help="number of clients N")] = 20,
    f_max: Annotated[int, typer.Option(help="max features per client F_max")] = 20,
    seed: int = 42,
    lookback: int = MODEL_DEFAULTS["lookback"],
    horizon: int = MODEL_DEFAULTS["horizon"],
    d_qap: Annotated[int, typer.Option(help="QAP latent width; per feature when --projection channel")] = MODEL_DEFAULTS["d_qap"],
    qap_heads: int = MODEL_DEFAULTS["qap_heads"],
    hidden: Annotated[Optional[int], typer.Option(help="backbone width (default: paper value)")] = None,
    projection: Annotated[str, typer.Option(help="channel | qap | linear")] = MODEL_DEFAULTS["projection"],
    head: Annotated[str, typer.Option(help="shared | personal (FedPer); shared needs --projection channel")] = MODEL_DEFAULTS["head"],
    seasonal_base: Annotated[bool, typer.Option(help="forecast a correction to the lookback's seasonal average")] = MODEL_DEFAULTS["seasonal_base"],
    loss: Annotated[str, typer.Option(help="mae (the median, what MASE rewards) | mse (the mean)")] = MODEL_DEFAULTS["loss"],
    paper: Annotated[bool, typer.Option(help="FedQAPer's model (QAP, personal head, MSE, L=96, H=48, d_qap=128) "
                                        "where no option says otherwise")] = False,
    quantiles: Annotated[Optional[str], typer.Option(help="quantile levels incl. 0.5, e.g. 0.1,0.5,0.9: pinball loss, QS/ICP/MIL")] = None,
    stride: Annotated[int, typer.Option(help="step between training windows")] = 1,
    batch_size: int = TRAINING_DEFAULTS["batch_size"],
    lr: float = TRAINING_DEFAULTS["lr"],
    min_steps: Annotated[int, typer.Option(help="at least this many optimizer steps per round (more passes over a short history)")] = TRAINING_DEFAULTS["min_steps"],
    data: Annotated[Optional[Path], typer.Option(help="your own CSV (date column + numeric columns); default: bundled weather sites")] = None,
    date_column: Annotated[Optional[str], typer.Option(help="name of the date column in --data")] = None,
    fill: Annotated[str, typer.Option(help="gaps in --data: refuse | skip | ffill | interpolate")] = GapPolicy().fill,
    max_fill_steps: Annotated[int, typer.Option(help="longest gap (steps) that --fill fills")] = GapPolicy().max_fill_steps,
    dropout: Annotated[str, typer.Option(help="participation scenario: fpr (everyone) | rcd | vcpr | np | du")] = "fpr",
    absence: Annotated[float, typer.Option(help="share of missing updates under --dropout")] = 0.5,
    fraction: Annotated[float, typer.Option(help="share of the clients the round policy asks each round (a seeded "
                                            "draw, as the coordinator's [participation] fraction)")] = 1.0,
    twin: Annotated[str, typer.Option(help="impute missing clients: drop | stale | maf | wsf (FedDTW)")] = "drop",
    twin_max_age: Annotated[Optional[int], typer.Option(help="drop instead of imputing clients unseen for more rounds")] = None,
    strategy: Annotated[str, typer.Option(help="fedavg | fedavgm | fedadam | median | trimmed_mean | dp_fedavg | fedgame")] = "fedavg",
    aggregator: Annotated[str, typer.Option(help="fedgame: game | gat | mean (the personalized aggregation)")] = "game",
    server_lr: Annotated[float, typer.Option(help="fedavgm / fedadam: server learning rate")] = 1.0,
    server_momentum: Annotated[float, typer.Option(help="fedavgm / fedadam: server momentum (beta1)")] = 0.9,
    personal_epochs: Annotated[int, typer.Option(help="FedRep: epochs on the personal part alone first")] = 0,
    alternate: Annotated[bool, typer.Option(help="FedRep: then train the shared part alone")] = False,
    prox_mu: Annotated[float, typer.Option(help="FedProx: proximal weight on the shared part")] = 0.0,
    keep_local: Annotated[bool, typer.Option(help="each client also keeps a local-only model and serves the better")] = TRAINING_DEFAULTS["keep_local"],
    anchors: Annotated[str, typer.Option(help="anchors a client serves where they validate better, comma-separated "
                                         "('' for none): seasonal_naive, seasonal_naive_week, window_average, ets, theta, mstl")] = ",".join(TRAINING_DEFAULTS["anchors"]),
    median: Annotated[bool, typer.Option(help="a client may also serve the median of its models and lookback anchors")] = TRAINING_DEFAULTS["median"],
    selection_days: Annotated[int, typer.Option(help="choose what each client serves on its latest N days of validation "
                                                "windows (0: all)")] = TRAINING_DEFAULTS["selection_days"],
    history_days: Annotated[Optional[int], typer.Option(help="keep only the last N days of training history per client")] = None,
    baselines: Annotated[bool, typer.Option(help="also every anchor alone, local-only and centralized, on the same windows")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the results here: rounds, and every client's "
                                                     "MASE/MSE/MAE per method and what it serves")] = None,
    save_models: Annotated[Optional[Path], typer.Option(help="folder: one checkpoint per client (best round)")] = None,
) -> None:
    """Run an in-process FedPer federation over feature-level non-IID clients and print each round."""
    from coordinator.simulation.federation import FederationConfig, run_federation
    from coordinator.simulation.participation import participation
    from edge_agent.data import build_pool, feature_clients, load_csv, load_sites, steps_per_day
    from edge_agent.models import ModelConfig

    try:
        sizes = dict(lookback=lookback, horizon=horizon, d_qap=d_qap, qap_heads=qap_heads, projection=projection,
                     head=head, seasonal_base=seasonal_base, loss=loss)
        given = {name: value for name, value in sizes.items() if value != MODEL_DEFAULTS[name]} if paper else sizes
        cfg = (ModelConfig.paper if paper else ModelConfig)(backbone=backbone, hidden=hidden,
                                                            quantiles=parse_levels(quantiles), **given)
        fed = FederationConfig(
            rounds=rounds, local_epochs=local_epochs, batch_size=batch_size, lr=lr, min_steps=min_steps, seed=seed, twin=twin,
            twin_max_age=twin_max_age, strategy=strategy, server={"lr": server_lr, "momentum": server_momentum},
            personal_epochs=personal_epochs, alternate=alternate, prox_mu=prox_mu, keep_local=keep_local,
            anchors=tuple(a.strip() for a in anchors.split(",") if a.strip()), median=median,
            selection_days=selection_days, game={"variant": aggregator}, participation={"fraction": fraction},
        )
        if fraction < 1.0 and dropout != "fpr":
            raise ValueError("--fraction samples the clients of each round; --dropout makes the asked ones miss "
                             "rounds: choose one")
        matrix = None if fraction < 1.0 else participation(dropout, rounds, clients, absence, seed)
        gaps = GapPolicy(fill=fill, max_fill_steps=max_fill_steps)
        if not data and gaps != GapPolicy():
            raise ValueError("--fill and --max-fill-steps apply to --data (the bundled weather sites have no gaps)")
        sites = [] if data else load_sites()
        pool = load_csv(data, date_column, gaps=gaps) if data else build_pool(sites)
        history = None if history_days is None else history_days * steps_per_day(pool)
        fleet = feature_clients(pool, clients, f_max, seed, cfg.lookback, cfg.horizon, stride, history=history)
    except (DataError, ValidationError, ValueError) as exc:
        fail(str(exc))
    if pool.gaps and pool.gaps.gaps:
        console.print(f"{pool.name}: {pool.gaps.summary()}", soft_wrap=True)
    counts = [c.n_features for c in fleet]
    dropped = sum(c.train.dropped for c in fleet)
    console.print(
        f"[bold]{len(fleet)} clients[/] from a pool of {pool.n_features} features "
        f"({pool.name if data else f'{len(sites)} pvlib weather sites'}); "
        f"features per client {min(counts)}..{max(counts)}; {sum(c.n_train for c in fleet)} train windows"
        f"{f' ({dropped} dropped at gaps)' if dropped else ''}; backbone {backbone} ({cfg.projection})"
    )
    table = round_table(cfg.quantiles is not None)
    with Live(table, console=console, refresh_per_second=4):
        result = run_federation(
            fleet, cfg, fed, participation=matrix,
            on_round=lambda r: table.add_row(
                str(r.round), f"{r.train_loss:.4f}", f"{r.val.score:.4f}",
                *((f"{r.test.mase:.4f}", f"{r.test.mse:.4f}") if r.test else ("-", "-")),
                *(quantile_cells(r.test) if cfg.quantiles else ()),
                str(len(r.present)), str(len(r.imputed)), served_counts(r.serving),
                f"{r.wire_bytes / 1e3:.1f}", f"{r.seconds:.1f}",
            ),
        )
    console.print()
    console.print(f"best round {result.best_round} (by validation): {metric_line(result.test)}; "
                  f"served: {served_counts({c: s.which for c, s in zip(result.client_test, result.served)})}")
    rates = fleet_firing_rates(result.models, fleet)
    if rates:
        silent = [name for name, rate in rates.items() if rate == 0]
        console.print("firing rates (test windows, mean over clients): "
                      + ", ".join(f"{name.removeprefix('shared.backbone.')} {rate:.3f}" for name, rate in rates.items())
                      + (f"; silent: {', '.join(silent)}" if silent else ""), soft_wrap=True)
    summary = {
        "config": {"model": cfg.model_dump(), "federation": fed.model_dump(), "clients": clients, "f_max": f_max,
                   "dropout": dropout, "absence": 0.0 if matrix is None else matrix.absence_rate},
        "rounds": [
            {"round": r.round, "train_loss": r.train_loss, "val_score": r.val.score,
             **{f"test_{k}": v for k, v in metric_values(r.test).items()},
             "present": list(r.present), "imputed": list(r.imputed), "dropped": list(r.dropped),
             "late": list(r.late), "serving": r.serving, "seconds": r.seconds, "wire_bytes_per_client": r.wire_bytes}
            for r in result.records
        ],
        "fed": {**metric_values(result.test), "best_round": result.best_round},
        "firing_rates": rates,
        "clients": {name: {"serves": served.which, "served": metric_values(result.client_test[name])}
                    for name, served in zip(result.client_test, result.served)},
    }
    if save_models:
        from edge_agent.models import save_checkpoint

        for model, client in zip(result.models, fleet):
            save_checkpoint(model, save_models / f"{client.name}.safetensors", list(client.columns))
        console.print(f"wrote {len(fleet)} checkpoints to {save_models}")
    if baselines:
        run_baselines(fleet, cfg, fed, summary)
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2))
        console.print(f"wrote {json_out}")


def fleet_firing_rates(models: list, fleet: list) -> dict[str, float]:
    """Each LIF layer's firing rate on the clients' first test windows, mean over clients (empty for an ANN)."""
    from export.opcount import firing_rates

    per_client = [firing_rates(model, client.test) for model, client in zip(models, fleet)]
    names = per_client[0] if per_client else {}
    return {name: sum(rates[name] for rates in per_client) / len(per_client) for name in names}


def served_counts(serving: dict[str, str]) -> str:
    """How many clients serve each candidate, e.g. "federated 6, ets 3, local 1"."""
    counts: dict[str, int] = {}
    for which in serving.values():
        counts[which] = counts.get(which, 0) + 1
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda item: -item[1])) or "-"


def metric_values(metrics: Metrics | None) -> dict[str, float | None]:
    """A result's MASE, MSE, MAE (and quantile scores) for the JSON summary."""
    if metrics is None:
        return {"mase": None, "mse": None, "mae": None}
    return {"mase": metrics.mase, "mse": metrics.mse, "mae": metrics.mae, **quantile_summary(metrics)}


class PretrainStrategy(str, Enum):
    """How ``edgefl pretrain`` aggregates (the strategies of ``coordinator.simulation.pretrain``)."""

    fedavg = "fedavg"
    fedal = "fedal"


@app.command("pretrain")
@needs("coordinator")
def pretrain_command(
    out: Annotated[Path, typer.Option(help="foundation checkpoint to write")] = Path("runs/foundation.safetensors"),
    strategy: Annotated[PretrainStrategy, typer.Option(help="fedavg: FedPoD's masked pretraining (appendix B.1); fedal: FeDaL's "
                                          "bias elimination, core-sets and server correction")] = PretrainStrategy.fedavg,
    rounds: Annotated[int, typer.Option(help="federated rounds (paper: 20)")] = 5,
    local_epochs: Annotated[int, typer.Option(help="local epochs per round (paper: 20)")] = 1,
    participation: Annotated[float, typer.Option(help="share C of devices per round (paper: 0.5)")] = 0.5,
    window: Annotated[int, typer.Option(help="hours the model sees: past + forecast horizon")] = 24,
    stride: Annotated[int, typer.Option(help="step between training windows")] = 3,
    paper_sizes: Annotated[bool, typer.Option(help="d_model 256, 4 layers, 8 heads (Table 9)")] = False,
    steps: Annotated[str, typer.Option(help="resolutions of every site in the fleet, e.g. 1h,3h,6h "
                                       "(mean per interval)")] = "1h",
    per_variable: Annotated[bool, typer.Option(help="also one client per measured variable of every site")] = False,
    extra_series: Annotated[bool, typer.Option(help="also pvlib's other real series: Craig CO every 30 min and "
                                               "hourly rain + particulates (adds their quantities to the model)")] = False,
    seed: int = 42,
) -> None:
    """Pretrain the foundation model by masked reconstruction, federated over the weather sites
    (with --steps, --per-variable and --extra-series: a fleet that mixes resolutions and quantities)."""
    from coordinator.simulation.pretrain import PretrainConfig, pretrain
    from edge_agent.data import load_sites
    from edge_agent.data.canonical import device_series
    from edge_agent.data.extra import EXTRA_VARIABLES, extra_series as load_extra
    from edge_agent.data.resample import mixed_fleet
    from edge_agent.data.weather import WEATHER_VARIABLES
    from edge_agent.models.foundation import FoundationConfig, save_foundation

    try:
        variables = WEATHER_VARIABLES + (EXTRA_VARIABLES if extra_series else ())
        fm = (FoundationConfig.paper if paper_sizes else FoundationConfig)(window=window, variables=variables)
        cfg = PretrainConfig(strategy=strategy.value, rounds=rounds, local_epochs=local_epochs, participation=participation,
                             stride=stride, seed=seed)
        fleet = mixed_fleet(load_sites(), [s.strip() for s in steps.split(",")], per_variable)
        fleet += load_extra() if extra_series else []
        devices = [device_series(table, fm.variables, fm.window, stride) for table in fleet]
    except (DataError, ValidationError, ValueError) as exc:
        fail(str(exc))
    table = Table("round", "devices", "train loss", "val masked MSE", "seconds", title=f"foundation pretraining ({strategy.value})")
    with Live(table, console=console, refresh_per_second=4):
        model, _ = pretrain(devices, fm, cfg, lambda r: table.add_row(
            str(r.round), _devices(r.devices, len(devices)), f"{r.train_loss:.4f}", f"{r.val_loss:.4f}", f"{r.seconds:.1f}"))
    digest = save_foundation(model, out)
    console.print(f"\nwrote {out} (sha256 {digest})", soft_wrap=True)


def _devices(names: tuple[str, ...], fleet: int, shown: int = 6) -> str:
    """The devices of a round by name, or how many of the fleet where names would not fit."""
    return ", ".join(names) if len(names) <= shown else f"{len(names)} of {fleet}"


def run_baselines(fleet, cfg, fed, summary: dict) -> None:
    """Every anchor alone, then local-only and centralized with the same epoch budget as the
    federation, on the same test windows and scale; prints each with how many gateways the served
    models beat it for, and adds every client's scores to ``summary``."""
    from coordinator.simulation.baselines import TrainingBudget, run_centralized, run_local_only
    from edge_agent.anchors import ANCHORS
    from edge_agent.selection import anchor_metrics

    served = {name: summary["clients"][name]["served"]["mase"] for name in summary["clients"]}
    for name in ANCHORS:
        console.print(f"fitting and running the {name} anchor on {len(fleet)} clients ...")
        per_client = {c.name: anchor_metrics(c, name, "test") for c in fleet}
        report_baseline(name, {k: v for k, v in per_client.items() if v is not None}, served, summary)
    for name, runner in (("local", run_local_only), ("centralized", run_centralized)):
        console.print(f"training the {name} baseline ...")
        res = runner(fleet, cfg, TrainingBudget.matching(fed))
        report_baseline(name, res.client_test, served, summary)


def report_baseline(name: str, per_client: dict, served: dict[str, float], summary: dict) -> None:
    """One baseline's line (mean MASE over its clients, how many gateways the served models beat it
    for) and its per-client scores in ``summary``."""
    if not per_client:
        console.print(f"{name:>19}: needs more history than the clients have")
        return
    from edge_agent.train import weighted_metrics

    fleet = weighted_metrics(list(per_client.values()), [1] * len(per_client))  # the mean over gateways
    gained = sum(served[c] < m.mase for c, m in per_client.items())
    console.print(f"{name:>19}: MASE {fleet.mase:.4f}; what the gateways serve beats it on {gained}/{len(per_client)}")
    summary.setdefault("baselines", {})[name] = metric_values(fleet)
    for client, metrics in per_client.items():
        summary["clients"][client][name] = metric_values(metrics)


if __name__ == "__main__":
    app()
