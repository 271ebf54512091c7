"""The ``edgefl`` command line, run as a user would run it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edge_agent.data import synthetic_table


def edgefl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgefl.cli", *args], capture_output=True, text=True, timeout=300
    )


def write_csv(path: Path, n_rows: int = 400) -> Path:
    table = synthetic_table(n_features=3, n_steps=n_rows, seed=2)
    frame = pd.DataFrame(table.values, columns=["OT", "HUFL", "LULL"])
    frame.insert(0, "date", table.index.strftime("%Y-%m-%d %H:%M:%S"))
    frame["station"] = "north field"  # a text column, as real exports have: ignored, and said so
    frame.to_csv(path, index=False)
    return path


def simulate_small(tmp_path: Path, rounds: int, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``edgefl simulate`` of 3 clients on a synthetic CSV; returns the run and its JSON path."""
    csv, out = write_csv(tmp_path / "ETTh1.csv"), tmp_path / "result.json"
    proc = edgefl(
        "simulate", "--data", str(csv), "--clients", "3", "--f-max", "2", "--rounds", str(rounds),
        "--lookback", "24", "--horizon", "12", "--d-qap", "16", "--batch-size", "32", "--json", str(out), *extra,
    )
    return proc, out


def test_simulate_on_a_user_csv_prints_every_round_and_writes_json(tmp_path: Path) -> None:
    proc, out = simulate_small(tmp_path, 2, "--baselines")
    assert proc.returncode == 0, proc.stderr
    assert "3 clients" in proc.stdout and "best round" in proc.stdout
    assert "local" in proc.stdout and "centralized" in proc.stdout
    lines = proc.stdout.splitlines()  # piped: one plain line per round, as it ends, before the summary
    rounds = [i for i, line in enumerate(lines) if line.startswith(("round 1; train loss", "round 2; train loss"))]
    assert len(rounds) == 2 and max(rounds) < next(i for i, line in enumerate(lines) if line.startswith("best round"))
    assert "kB/client" in lines[rounds[0]]
    summary = json.loads(out.read_text())
    assert [r["round"] for r in summary["rounds"]] == [1, 2]
    assert all(np.isfinite(r["val_score"]) for r in summary["rounds"])
    assert {"local", "centralized", "seasonal_naive", "window_average", "ets"} <= summary["baselines"].keys()
    for client in summary["clients"].values():  # every client's scores per method and what it serves
        assert set(client["serves"].split(" + ")) <= {"federated", "local", "seasonal_naive", "seasonal_naive_week",
                                                      "window_average", "ets", "ets_noseason", "theta", "median"}
        assert client["served"]["mase"] > 0 and {"local", "centralized", "ets"} <= client.keys()
    assert "what the gateways serve beats it on" in proc.stdout
    assert "ETTh1.csv: ignored 1 text column(s) 'station': not numbers" in " ".join(proc.stderr.split())


def test_simulate_of_a_spiking_backbone_reports_every_layers_firing_rate(tmp_path: Path) -> None:
    proc, out = simulate_small(tmp_path, 1, "--backbone", "spikernn", "--hidden", "16")
    assert proc.returncode == 0, proc.stderr
    rates = json.loads(out.read_text())["firing_rates"]
    assert len(rates) == 4 and "shared.backbone.encoder.lif" in rates
    assert all(0.005 < rate < 0.9 for rate in rates.values()), rates  # every layer carries spikes after training
    assert "firing rates (test windows, mean over clients): encoder.lif" in proc.stdout


def test_simulate_names_the_silent_layers_of_a_barely_trained_spiking_transformer(tmp_path: Path) -> None:
    """16 optimizer steps leave most of a small iSpikformer silent (bench/firing.py measures the
    rates the full recipe reaches): every LIF layer is reported, and the silent ones are named."""
    proc, out = simulate_small(tmp_path, 1, "--backbone", "ispikformer", "--hidden", "16", "--min-steps", "16",
                               "--no-keep-local", "--anchors", "seasonal_naive", "--no-median")
    assert proc.returncode == 0, proc.stderr
    rates = json.loads(out.read_text())["firing_rates"]
    silent = [name.removeprefix("shared.backbone.") for name, rate in rates.items() if rate == 0]
    assert len(rates) == 16 and silent
    assert f"; silent: {', '.join(silent)}" in " ".join(proc.stdout.split())


def test_simulate_under_dropout_imputes_with_the_chosen_twin(tmp_path: Path) -> None:
    proc, out = simulate_small(tmp_path, 4, "--dropout", "rcd", "--absence", "0.5", "--twin", "stale")
    csv = tmp_path / "ETTh1.csv"
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(out.read_text())["rounds"]
    assert sum(len(r["present"]) for r in rounds) == 6  # 50% of 4 rounds x 3 clients
    assert sum(len(r["imputed"]) + len(r["dropped"]) for r in rounds) == 6
    assert any(r["imputed"] for r in rounds)
    proc = edgefl("simulate", "--data", str(csv), "--twin", "kalman")
    assert proc.returncode == 2 and "error: --twin: " in proc.stderr and "kalman" in proc.stderr and "wsf" in proc.stderr
    proc = edgefl("simulate", "--data", str(csv), "--dropout", "storm")
    assert proc.returncode == 2 and "storm" in proc.stderr and "rcd" in proc.stderr


def test_simulate_with_a_fraction_asks_the_round_policys_clients(tmp_path: Path) -> None:
    """``--fraction``: the coordinator's round policy in the simulation; the clients not asked
    are not missing (no twin stands in for them), and a dropout scenario on top is refused."""
    proc, out = simulate_small(tmp_path, 3, "--fraction", "0.5", "--twin", "stale")
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(out.read_text())["rounds"]
    assert [len(r["present"]) for r in rounds] == [2, 2, 2]  # ceil(0.5 x 3) a round
    assert not any(r["imputed"] or r["dropped"] for r in rounds)
    assert len({tuple(r["present"]) for r in rounds}) > 1
    proc = edgefl("simulate", "--data", str(tmp_path / "ETTh1.csv"), "--fraction", "0.5", "--dropout", "rcd")
    assert proc.returncode == 2 and "--fraction" in proc.stderr


def test_simulate_reports_bad_input_clearly(tmp_path: Path) -> None:
    short = write_csv(tmp_path / "short.csv", n_rows=50)
    proc = edgefl("simulate", "--data", str(short), "--lookback", "24", "--horizon", "12")
    assert proc.returncode == 2
    assert "short.csv" in proc.stderr and "at least" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    proc = edgefl("simulate", "--data", str(tmp_path / "missing.csv"))
    assert proc.returncode == 2 and "missing.csv" in proc.stderr and "not found" in proc.stderr
    proc = edgefl("simulate", "--backbone", "resnet", "--data", str(short))
    assert proc.returncode == 2 and "error: --backbone: " in proc.stderr and "dlinear" in proc.stderr


def test_simulate_refuses_gaps_unless_told_to_fill_or_skip_them(tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "gaps.csv")
    lines = csv.read_text().splitlines()
    csv.write_text("\n".join(lines[:100] + lines[102:250] + lines[270:]) + "\n")  # 2 and 20 missing hours
    proc = edgefl("simulate", "--data", str(csv), "--lookback", "24", "--horizon", "12")
    out = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "2 gaps in the timestamps (22 missing steps" in out and "--fill" in out
    proc = edgefl(
        "simulate", "--data", str(csv), "--clients", "3", "--f-max", "2", "--rounds", "1", "--lookback", "24",
        "--horizon", "12", "--d-qap", "16", "--fill", "ffill", "--max-fill-steps", "2",
    )
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stderr
    assert ("gaps.csv: one row every 1:00:00; 2 gaps (22 missing steps); filled 1 (2 steps) by ffill"
            in " ".join(proc.stderr.split()))
    assert "dropped at gaps" in out and "best round" in out
    proc = edgefl("simulate", "--fill", "skip", "--rounds", "1")
    assert proc.returncode == 2 and "--fill and --max-fill-steps apply to --data" in " ".join(proc.stderr.split())


def test_sites_lists_the_bundled_weather_stations() -> None:
    proc = edgefl("sites")
    assert proc.returncode == 0, proc.stderr
    for site in ("sand_point", "miami", "amsterdam", "burlington"):
        assert site in proc.stdout


def test_service_configs_are_validated_with_the_field_named(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text('fleet = "farm"\nstate_dir = "/tmp/x"\nrounds = 0\n\n[broker]\nport = 70000\n')
    proc = edgefl("coordinator", "serve", "--config", str(config))
    assert proc.returncode == 2
    assert "coordinator.toml" in proc.stderr and "rounds" in proc.stderr and "broker.port" in proc.stderr
    agent = tmp_path / "agent.toml"
    agent.write_text('fleet = "farm"\nclient_id = "a/b"\nstate_dir = "/tmp/y"\n[data]\nsite = "miami"\ncsv = "x.csv"\n')
    proc = edgefl("agent", "run", "--config", str(agent))
    assert proc.returncode == 2
    assert "client_id" in proc.stderr and "exactly one of csv or site" in proc.stderr
    proc = edgefl("agent", "run", "--config", str(tmp_path / "nope.toml"))
    assert proc.returncode == 2 and "file not found" in proc.stderr


def test_pretrain_writes_a_hashed_foundation_checkpoint(tmp_path: Path) -> None:
    from edge_agent.models.foundation import content_hash, load_foundation

    out = tmp_path / "fm.safetensors"
    proc = edgefl("pretrain", "--rounds", "1", "--stride", "48", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    digest = proc.stdout.split("sha256")[-1].strip(" )\n").replace("\n", "")
    assert content_hash(load_foundation(out, expected_hash=digest)) == digest
    proc = edgefl("pretrain", "--participation", "1.5", "--out", str(out))
    assert proc.returncode == 2 and "error: --participation: should be less than or equal to 1, got 1.5" in proc.stderr


def test_pretrain_over_a_fleet_of_mixed_resolutions_and_quantities(tmp_path: Path) -> None:
    out = tmp_path / "fm.safetensors"
    proc = edgefl("pretrain", "--rounds", "1", "--stride", "96", "--steps", "1h,6h", "--per-variable",
                  "--participation", "0.1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.is_file()
    proc = edgefl("pretrain", "--steps", "1h,90min", "--out", str(out))
    assert proc.returncode == 2 and "whole multiple" in proc.stderr


def test_fedal_pretraining_with_the_extra_real_series_writes_a_checkpoint_with_their_quantities(tmp_path: Path) -> None:
    from edge_agent.data.variables import EXTRA_VARIABLES
    from edge_agent.models.foundation import load_foundation

    out = tmp_path / "fm.safetensors"
    proc = edgefl("pretrain", "--strategy", "fedal", "--rounds", "1", "--stride", "96", "--extra-series",
                  "--participation", "0.3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "foundation pretraining (fedal)" in proc.stdout
    model = load_foundation(out)
    assert model.cfg.variables[-3:] == EXTRA_VARIABLES and float(model.latent_bias.abs().sum()) > 0
    proc = edgefl("pretrain", "--strategy", "fedprox", "--out", str(out))
    assert proc.returncode == 2 and "fedprox" in proc.stderr


def test_a_start_quorum_that_closed_registration_can_never_reach_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text('fleet = "farm"\nstate_dir = "/tmp/x"\nstart_clients = 3\nregistration = "closed"\n'
                      'allowed_clients = ["a", "b"]\n')
    proc = edgefl("coordinator", "serve", "--config", str(config))
    assert proc.returncode == 2
    assert "start_clients: 3 can never register; allowed_clients lists 2" in " ".join(proc.stderr.split())


def test_simulate_with_quantiles_reports_qs_icp_and_mil(tmp_path: Path) -> None:
    proc, out = simulate_small(tmp_path, 2, "--quantiles", "0.1,0.5,0.9", "--baselines")
    assert proc.returncode == 0, proc.stderr
    assert ", QS " in proc.stdout and ", ICP " in proc.stdout and ", MIL " in proc.stdout
    summary = json.loads(out.read_text())
    assert 0.0 <= summary["fed"]["icp"] <= 1.0 and summary["fed"]["qs"] > 0 and summary["fed"]["mil"] > 0
    assert all("test_icp" in r for r in summary["rounds"])
    assert "icp" in summary["baselines"]["local"] and "icp" in summary["baselines"]["centralized"]
    proc = edgefl("simulate", "--data", str(tmp_path / "ETTh1.csv"), "--quantiles", "0.1,0.9")
    assert proc.returncode == 2 and "error: --quantiles: " in proc.stderr and "0.5" in proc.stderr
    proc = edgefl("simulate", "--data", str(tmp_path / "ETTh1.csv"), "--quantiles", "0.1,x")
    assert proc.returncode == 2 and "error: --quantiles: should be a valid number" in proc.stderr


@pytest.mark.parametrize(("args", "expected"), [
    (("simulate", "--rounds", "0"), "error: --rounds: should be greater than or equal to 1, got 0"),
    (("simulate", "--server-lr", "-1"), "error: --server-lr: should be greater than 0, got -1.0"),
    (("simulate", "--aggregator", "ga"), "error: --aggregator: "),
    (("simulate", "--round", "3"), "error: No such option: --round"),
    (("pretrain", "--rounds", "x"), "error: Invalid value for '--rounds'"),
])
def test_a_bad_flag_is_one_line_on_stderr_naming_it(args: tuple[str, ...], expected: str) -> None:
    proc = edgefl(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith(expected) and proc.stderr.count("\n") == 1, proc.stderr
    assert "http" not in proc.stderr and "Traceback" not in proc.stderr


def test_an_unknown_config_key_gets_a_did_you_mean_per_line(tmp_path: Path) -> None:
    config = tmp_path / "coordinator.toml"
    config.write_text('fleet = "farm"\nstate_dir = "/tmp/x"\nround_timout_s = 3\n[broker]\nhots = "x"\n'
                      '[model]\nlookbak = 3\nzzz = 1\n')
    proc = edgefl("coordinator", "serve", "--config", str(config))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 4, proc.stderr
    assert all(line.startswith(f"error: {config}: ") for line in lines)
    assert f"error: {config}: round_timout_s: unknown key; did you mean 'round_timeout_s'?" in lines
    assert f"error: {config}: broker.hots: unknown key; did you mean 'host'?" in lines
    assert f"error: {config}: model.lookbak: unknown key; did you mean 'lookback'?" in lines
    assert any(line.startswith(f"error: {config}: model.zzz: unknown key; the keys here are ") for line in lines)


def command_tree(command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], object]]:
    """Every command below ``command`` (a click group or command) with its path of names."""
    out = [(path, command)]
    if hasattr(command, "list_commands"):
        context = command.context_class(command)
        for name in command.list_commands(context):
            out += command_tree(command.get_command(context, name), (*path, name))
    return out


def test_help_is_grouped_by_role_and_every_commands_help_shows_its_text_without_raw_markup() -> None:
    """``edgefl --help`` lists the commands to try first, then one panel per role; the help of
    every command and option keeps what its docstring says in square brackets (``[model]``, not
    eaten as markup), shows no reST backticks and no docstring line breaks inside a sentence."""
    import typer
    from typer.testing import CliRunner

    from edgefl.commands import app
    from edgefl.root import PANELS

    runner = CliRunner()
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    assert [top.index(f"─ {panel} ") for panel in PANELS] == sorted(top.index(f"─ {panel} ") for panel in PANELS)
    for path, command in command_tree(typer.main.get_command(app)):
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert shown.exit_code == 0, (path, shown.output)
        texts = [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
        for text in texts:
            assert "``" not in text and "\n" not in text.replace("\n\n", ""), (path, text)
            for bracketed in re.findall(r"\\(\[[^\]]+\])", text):
                assert bracketed in shown.output, (path, bracketed)
        assert "``" not in shown.output, path
