"""``edgefl simulate``: an in-process federation. Its model, training, strategy and gap options
are declared once, by the fields of ModelConfig, AgentTraining, FederationConfig and GapPolicy
(``edgefl.model_options``): the same keys as agent.toml and coordinator.toml. Loaded only when
run (``edgefl.root``); its options and files are checked before the simulation and the data
loaders (torch, pandas) are imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from coordinator.simulation.federation_config import FederationConfig
from edge_agent.config import AgentTraining
from edge_agent.data import DataError, GapPolicy
from edge_agent.data.errors import file_not_found
from edge_agent.models import ModelConfig
from edge_agent.models.config import PAPER
from edge_agent.times import interval_text
from edgefl.errors import flags_of, reported, say
from edgefl.model_options import ModelOptions
from edgefl.progress import heartbeat, live_rounds
from edgefl.root import START

if TYPE_CHECKING:
    from edge_agent.data.table import SeriesTable
    from edge_agent.train import Metrics

app = typer.Typer()
console = Console()
OPTIONS = ModelOptions({
    ModelConfig: ("backbone", "interval", "lookback", "horizon", "season", "d_qap", "qap_heads", "hidden",
                  "projection", "head", "seasonal_base", "loss", "quantiles"),
    AgentTraining: ("local_epochs", "batch_size", "lr", "min_steps", "max_steps", "stride", "personal_epochs", "alternate",
                    "prox_mu", "keep_local", "anchors", "median", "selection_days", "combine"),
    FederationConfig: ("rounds", "seed", "twin", "twin_max_age", "late_updates", "strategy", "server.lr",
                       "server.momentum", "game.variant", "participation.fraction"),
    GapPolicy: ("fill", "max_fill_steps"),
}, names={"game.variant": "aggregator", "participation.fraction": "fraction"})


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


def given_options(ctx: typer.Context, settings: dict[str, Any]) -> set[str]:
    """The options the command line sets (the others keep their defaults)."""
    return {name for name in settings if ctx.get_parameter_source(name).name != "DEFAULT"}


def at_data_interval(cfg: ModelConfig, given: set[str], table: SeriesTable) -> ModelConfig:
    """The model for the data's sampling interval: with ``--interval`` the data must have it (one
    line naming the interval found otherwise); without, the model's spans left unset (a week of
    lookback, a day of horizon and season) are counted in steps of the data's own interval."""
    from edge_agent.data import check_interval, sampling_step

    if "interval" in given:
        check_interval(table, cfg.interval_ns)
        return cfg
    return cfg.at_interval(interval_text(int(sampling_step(table).value)), keep=given | set(PAPER))


def configs(ctx: typer.Context, paper: bool, settings: dict[str, Any]
            ) -> tuple[ModelConfig, FederationConfig, GapPolicy, int]:
    """The model, federation and gap settings the options give, and the training windows' stride;
    ``--paper``: FedQAPer's model where no option on the command line says otherwise."""
    given = given_options(ctx, settings)
    cfg = (ModelConfig.paper if paper else ModelConfig)(**OPTIONS.values(ModelConfig, settings, only=given))
    training = OPTIONS.values(AgentTraining, settings)
    stride = AgentTraining(**training).stride
    del training["stride"]  # how densely windows are cut, not how a round trains
    fed = FederationConfig(**OPTIONS.values(FederationConfig, settings), **training)
    return cfg, fed, GapPolicy(**OPTIONS.values(GapPolicy, settings)), stride


def simulate(
    ctx: typer.Context,
    clients: Annotated[int, typer.Option(help="number of clients N")] = 20,
    f_max: Annotated[int, typer.Option(help="max features per client F_max")] = 20,
    paper: Annotated[bool, typer.Option(help="FedQAPer's model (QAP, personal head, MSE, L=96, H=48, d_qap=128) "
                                        "where no option says otherwise")] = False,
    data: Annotated[Optional[Path], typer.Option(help="your own CSV (date column + numeric columns), or a folder "
                                                 "of CSVs, one gateway each; default: bundled weather sites")] = None,
    date_column: Annotated[Optional[str], typer.Option(help="name of the date column in --data")] = None,
    site_column: Annotated[Optional[str], typer.Option(help="column of the --data CSV naming each row's site: one "
                                                       "gateway per site")] = None,
    dropout: Annotated[str, typer.Option(help="participation scenario: fpr (everyone) | rcd | vcpr | np | du")] = "fpr",
    absence: Annotated[float, typer.Option(help="share of missing updates under --dropout")] = 0.5,
    history_days: Annotated[Optional[int], typer.Option(help="keep only the last N days of training history per "
                                                        "client")] = None,
    baselines: Annotated[bool, typer.Option(help="also every anchor alone, local-only and centralized, on the same "
                                            "windows")] = False,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the results here: rounds, and every "
                                                     "client's MASE/MSE/MAE per method, of its federated model "
                                                     "and of what it serves")] = None,
    save_models: Annotated[Optional[Path], typer.Option(help="folder: one checkpoint per client (best round)")] = None,
    **settings: Any,
) -> None:
    """Run an in-process FedPer federation over feature-level non-IID clients (or one client per
    site of --data: a folder of CSVs, or --site-column) and print each round."""
    flags = {**OPTIONS.flags, **flags_of("clients", "f_max", "dropout", "absence", "history_days")}
    with reported(DataError, ValueError, flags=flags):
        cfg, fed, gaps, stride = configs(ctx, paper, settings)
        if data is not None and not data.exists():
            raise file_not_found(data)
        if fed.participation.fraction < 1.0 and dropout != "fpr":
            raise ValueError("--fraction samples the clients of each round; --dropout makes the asked ones miss "
                             "rounds: choose one")
        if not data and gaps != GapPolicy():
            raise ValueError("--fill and --max-fill-steps apply to --data (the bundled weather sites have no gaps)")
        if site_column and not data:
            raise ValueError("--site-column names a column of the --data CSV")
        per_site = data is not None and (data.is_dir() or site_column is not None)
        drawn = [f"--{name.replace('_', '-')}" for name in ("clients", "f_max")
                 if ctx.get_parameter_source(name).name != "DEFAULT"]
        if per_site and drawn:
            raise ValueError(f"{' and '.join(drawn)}: for the feature draw over one pooled CSV; per-site data "
                             "(a folder of CSVs or --site-column) has one client per site and no draw")
        from coordinator.simulation.participation import participation
        from edge_agent.data import (build_pool, feature_clients, load_csv, load_gateways, load_sites, site_clients,
                                     steps_per_day)

        sites = [] if data else load_sites()
        tables = (load_gateways(data, date_column, site_column, gaps) if per_site else
                  [load_csv(data, date_column, gaps=gaps) if data else build_pool(sites)])
        cfg = at_data_interval(cfg, given_options(ctx, settings), tables[0])
        history = None if history_days is None else history_days * steps_per_day(tables[0])
        fleet = (site_clients(tables, cfg.lookback, cfg.horizon, stride, history) if per_site else
                 feature_clients(tables[0], clients, f_max, fed.seed, cfg.lookback, cfg.horizon, stride,
                                 history=history))
        matrix = (None if fed.participation.fraction < 1.0 else
                  participation(dropout, fed.rounds, len(fleet), absence, fed.seed))
    for note in [*(note for table in tables for note in table.notes), *cfg.step_notes()]:
        say(note)
    console.print(f"rows every {interval_text(cfg.interval_ns)}: lookback {cfg.lookback} steps "
                  f"({interval_text(cfg.lookback * cfg.interval_ns)}), horizon {cfg.horizon} "
                  f"({interval_text(cfg.horizon * cfg.interval_ns)}), season {cfg.season} "
                  f"({interval_text(cfg.season * cfg.interval_ns)})")
    counts = [c.n_features for c in fleet]
    dropped = sum(c.train.dropped for c in fleet)
    pool = tables[0]
    source = (f", one per site of {data.name}" if per_site else f" from a pool of {pool.n_features} features "
              f"({pool.name if data else f'{len(sites)} pvlib weather sites'})")
    console.print(
        f"[bold]{len(fleet)} clients[/]{source}; "
        f"features per client {min(counts)}..{max(counts)}; {sum(c.n_train for c in fleet)} train windows"
        f"{f' ({dropped} dropped at gaps)' if dropped else ''}; backbone {cfg.backbone} ({cfg.projection})"
    )
    from coordinator.simulation.federation import run_federation

    table = round_table(cfg.quantiles is not None)
    with live_rounds(console, table) as show_round, heartbeat(say_line, "rounds (each client fits its anchors in "
                                                                         "the first)"):
        result = run_federation(
            fleet, cfg, fed, participation=matrix,
            on_round=lambda r: show_round([
                str(r.round), f"{r.train_loss:.4f}", f"{r.val.score:.4f}",
                *((f"{r.test.mase:.4f}", f"{r.test.mse:.4f}") if r.test else ("-", "-")),
                *(quantile_cells(r.test) if cfg.quantiles else ()),
                str(len(r.present)), str(len(r.imputed)), served_counts(r.serving),
                f"{r.wire_bytes / 1e3:.1f}", f"{r.seconds:.1f}",
            ]),
        )
    console.print()
    console.print(f"best round {result.best_round} (by validation): {metric_line(result.test)}; "
                  f"served: {served_counts({c: s.label for c, s in zip(result.client_test, result.served)})}")
    rates = fleet_firing_rates(result.models, fleet)
    if rates:
        from export.silence import silent_layers

        short = {name.removeprefix("shared.backbone."): rate for name, rate in rates.items()}
        silent = silent_layers(short)
        console.print("firing rates (test windows, mean over clients): "
                      + ", ".join(f"{name} {rate:.3f}" for name, rate in short.items())
                      + (f"; silent: {', '.join(silent)}" if silent else ""), soft_wrap=True)
    summary = {
        "config": {"model": cfg.model_dump(), "federation": fed.model_dump(), "clients": len(fleet),
                   "f_max": None if per_site else f_max,
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
        "federated": metric_values(result.federated),
        "clients": {name: {"serves": served.label, "served": metric_values(result.client_test[name]),
                           "federated": metric_values(result.client_federated[name])}
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


simulate.__signature__ = OPTIONS.signature(simulate)
app.command(rich_help_panel=START)(simulate)


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
        with heartbeat(say_line, f"the {name} anchor"):
            per_client = {c.name: anchor_metrics(c, name, "test") for c in fleet}
        report_baseline(name, {k: v for k, v in per_client.items() if v is not None}, served, summary)
    for name, runner in (("local", run_local_only), ("centralized", run_centralized)):
        console.print(f"training the {name} baseline ...")
        with heartbeat(say_line, f"the {name} baseline"):
            res = runner(fleet, cfg, TrainingBudget.matching(fed))
        report_baseline(name, res.client_test, served, summary)


def say_line(line: str) -> None:
    """A progress line, piped or on a terminal."""
    console.print(line, soft_wrap=True)


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


