"""Installs by role: the serve extra holds neither torch nor pandas, a command whose extra is not
installed names it in one line, ``agent serve`` runs without typer, and the serving path's own
duration parser reads what pandas reads."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from typer.main import get_command

from edge_agent.times import parse_duration
from edgefl.cli import serve_options
from edgefl.commands import app
from edgefl.extras import MISSING_EXTRA_EXIT_CODE, missing_extra_line
from tests.fleet import agent_config, edgefl_without

REPO = Path(__file__).resolve().parent.parent


def requirements(extra: str | None) -> set[str]:
    """The distribution names an install of ``edgefl[extra]`` pulls, edgefl's own extras resolved."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[=<>~ ]", r)[0].lower() for r in project["dependencies"]}
    for requirement in project["optional-dependencies"].get(extra, []) if extra else []:
        inner = re.fullmatch(r"edgefl\[(.+)\]", requirement)
        names |= set().union(*map(requirements, inner.group(1).split(","))) if inner else {
            re.split(r"[\[=<>~ ]", requirement)[0].lower()}
    return names


def test_the_serve_extra_is_onnx_runtime_numpy_paho_and_pydantic_without_torch_or_pandas() -> None:
    serve, gateway = requirements("serve"), requirements("gateway")
    assert {"onnxruntime", "numpy", "paho-mqtt", "pydantic"} <= serve
    assert not {"torch", "pandas", "pvlib", "statsforecast", "matplotlib", "h5py"} & serve
    assert {"torch", "pandas", "safetensors", "statsforecast"} <= gateway and serve <= gateway
    assert requirements("gateway") | requirements("sites") | requirements("export") | requirements("coordinator") \
        == requirements("all")
    assert "pvlib" not in requirements("coordinator") | gateway and "pvlib" in requirements("sites")


@pytest.mark.parametrize("command, missing, extra", [
    (("agent", "run"), ("torch",), "gateway"),
    (("agent", "forecast"), ("pandas",), "gateway"),
    (("sites",), ("pvlib",), "sites"),
])
def test_a_command_whose_extra_is_missing_says_which_extra_to_install(tmp_path: Path, command, missing,
                                                                      extra) -> None:
    config = agent_config(tmp_path, 1883, 0, tmp_path / "none.csv")
    args = [*command, "-c", str(config)] if command[0] == "agent" else list(command)
    done = subprocess.run([sys.executable, *edgefl_without(missing), *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.returncode == MISSING_EXTRA_EXIT_CODE, done.stderr
    assert done.stderr.strip() == f"error: {missing_extra_line(extra, missing[0])}"
    assert f"pip install 'edgefl[{extra}]'" in done.stderr


@pytest.mark.parametrize("options", [
    ("-c", "a.toml"), ("--config", "a.toml", "--verbose"), ("--verbose", "--config=a.toml"),
    ("-c", "a.toml", "--verbose", "--no-verbose"), ("-c", "a.toml", "--config", "b.toml"),
])
def test_agent_serve_without_typer_reads_its_options_as_the_typer_command_does(options: tuple[str, ...]) -> None:
    command = get_command(app).commands["agent"].commands["serve"]
    params = command.make_context("serve", list(options)).params
    assert serve_options(["agent", "serve", *options]) == (params["config"], params["verbose"])


@pytest.mark.parametrize("args", [
    (), ("agent", "run", "-c", "a.toml"), ("agent", "serve"), ("agent", "serve", "--help"), ("agent", "serve", "-c"),
    ("agent", "serve", "-c", "a.toml", "--bogus"), ("agent", "serve", "-ca.toml"),
])
def test_any_other_command_line_goes_to_the_typer_app(args: tuple[str, ...]) -> None:
    assert serve_options(list(args)) is None


def test_agent_serve_reports_a_bad_config_without_typer_installed(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('fleet = "farm"\nclient_id = "a/b"\nstate_dir = "/tmp/y"\n[data]\nsource = "sensors"\n')
    done = subprocess.run([sys.executable, *edgefl_without(("typer", "torch", "pandas")), "agent", "serve", "-c",
                           str(config)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: {config}: client_id: String should match pattern '^[A-Za-z0-9_.-]{{1,64}}$', got 'a/b'",
        f"error: {config}: sensors: required: set it"]


@pytest.mark.parametrize("text", ["1h", "15min", "30s", "1h30min", "2 days", "1d", "500ms", "90 minutes",
                                  "1.5h", "1w", "2 hours", "10sec"])
def test_a_duration_reads_as_pandas_reads_it(text: str) -> None:
    assert parse_duration(text) == pd.Timedelta(text).value


@pytest.mark.parametrize("text", ["", "h", "1", "1 fortnight", "1h garbage", "-1h", "1h-30min", "P1D"])
def test_a_duration_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
