"""Fast errors (issue 45 item 5): a bad config, flag or file is reported before torch or any other
heavy library is imported, and the registries that configs check names against load their
classes only when used, each under the name it is registered by."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator.strategy_settings import STRATEGIES
from coordinator.twin_settings import TWIN_FORECASTERS
from edge_agent.models import BACKBONES
from edge_agent.registry import LazyRegistry
from tests.fleet import agent_config, coordinator_config, edgefl_without

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pandas", "statsforecast", "onnxruntime", "matplotlib", "snntorch", "paho")  # paho: 7 MB with ssl
WALL_S = 30.0  # generous: about 0.5 s idle here, several seconds on a loaded 2-core machine


def configs(folder: Path) -> dict[str, Path]:
    """An agent.toml and a coordinator.toml, each with the unknown table ``[modle]``, and a good
    coordinator.toml (``fleet``) whose state_dir is not there."""
    (folder / "fleet").mkdir()
    agent = agent_config(folder, 1883, 0, folder / "data.csv")
    coordinator = coordinator_config(folder, 1883, 3)
    for path in (agent, coordinator):
        path.write_text(path.read_text() + "\n[modle]\nlookback = 3\n")
    return {"agent": agent, "coordinator": coordinator, "fleet": coordinator_config(folder / "fleet", 1883, 3)}


CASES = [  # (arguments, with {agent}/{coordinator}/{fleet}/{tmp} filled in, the one error line expected)
    (("agent", "run", "-c", "{agent}"), "error: {agent}: modle: unknown key; did you mean 'mode'?"),
    (("agent", "forecast", "-c", "{agent}"), "error: {agent}: modle: unknown key; did you mean 'mode'?"),
    (("agent", "checkpoint", "-c", "{agent}", "--out", "{tmp}/m"), "error: {agent}: modle: unknown key; did you "
                                                                   "mean 'mode'?"),
    (("coordinator", "serve", "-c", "{coordinator}"), "error: {coordinator}: modle: unknown key; did you mean "
                                                      "'mode'?"),
    (("coordinator", "status", "-c", "{fleet}"), "error: state_dir {tmp}/fleet/coordinator: no coordinator state "
     "there (coordinator.sqlite3 is missing); check state_dir in the config, or start the coordinator (coordinator "
     "serve) first"),
    (("agent", "run", "-c", "{tmp}/missing.toml"), "error: {tmp}/missing.toml: file not found"),
    (("simulate", "--data", "{tmp}/nope.csv"), "error: nope.csv: file not found ({tmp}/nope.csv)"),
    (("simulate", "--backbone", "lstn"), "error: --backbone: backbone: unknown 'lstn'; choose one of "
                                         f"{sorted(BACKBONES)}"),
    (("simulate", "--twin", "wfs"), "error: --twin: twin forecaster: unknown 'wfs'; "
                                     f"choose one of {sorted(TWIN_FORECASTERS)}"),
    (("export", "onnx", "--checkpoint", "{tmp}/nope.pt", "--out", "{tmp}/x"),
     "error: give --agent-config, or --checkpoint with one of --site / --csv"),
    (("export", "onnx", "--checkpoint", "{tmp}/nope.pt", "--site", "pool", "--out", "{tmp}/x"),
     "error: nope.pt: file not found ({tmp}/nope.pt)"),
    (("energy", "--profile", "nope", "--checkpoint", "{tmp}/nope.pt", "--site", "pool", "--out", "{tmp}/e"),
     "error: unknown hardware profile 'nope'; available in hw_profiles: cmos45nm, jetson_orin_nano, loihi, "
     "truenorth"),
    (("pretrain", "--steps", "1h,7x"), "error: --steps: '7x' is not a duration such as '1h', '15min', '30s' or "
                                       "'1h30min'"),
    (("pretrain", "--participation", "2"), "error: --participation: should be less than or equal to 1, got 2.0"),
    (("init", "{tmp}/farm", "--fleet", "a b"), "error: fleet name 'a b' must match ^[A-Za-z0-9_.-]{{1,64}}$"),
    (("broker-config", "--fleet", "a b", "--out", "{tmp}/setup"), "error: fleet name 'a b' must match "
                                                                   "^[A-Za-z0-9_.-]{{1,64}}$"),
    (("replay", "--csv", "{tmp}/nope.csv"), "error: nope.csv: file not found ({tmp}/nope.csv)"),
    (("energy", "--agent-config", "{agent}", "--out", "{tmp}/e"), "error: {agent}: modle: unknown key; did you "
                                                                  "mean 'mode'?"),
]


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(args[:2]) for args, _ in CASES])
def test_a_bad_config_flag_or_file_is_one_line_before_any_heavy_library(tmp_path: Path, args: tuple[str, ...],
                                                                         expected: str) -> None:
    names = {"tmp": str(tmp_path), **{role: str(path) for role, path in configs(tmp_path).items()}}
    before = set(tmp_path.rglob("*"))
    start = time.monotonic()
    done = subprocess.run([sys.executable, *edgefl_without(HEAVY), *(a.format(**names) for a in args)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    wall = time.monotonic() - start
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    assert done.stderr == expected.format(**names) + "\n"  # not "this command needs edgefl[...]": nothing heavy
    assert wall < WALL_S, f"{wall:.1f} s"
    assert set(tmp_path.rglob("*")) == before, "a refused command leaves nothing behind (no empty --out folder)"


@pytest.mark.parametrize(("registry", "kind"), [(BACKBONES, "Backbone"), (STRATEGIES, "Strategy"),
                                                (TWIN_FORECASTERS, "TwinForecaster")])
def test_every_registered_name_loads_its_class_registered_under_that_name(registry: LazyRegistry,
                                                                          kind: str) -> None:
    for name in registry:
        entry = registry[name]
        assert kind in {base.__name__ for base in entry.__mro__}, (name, entry)
        assert getattr(entry, "name", name) == name, f"{entry.__name__} calls itself {entry.name!r}, not {name!r}"


def test_a_lookup_of_an_unknown_name_raises_key_error_and_a_name_check_imports_nothing() -> None:
    registry = LazyRegistry("edge_agent", {"missing": "no_such_module:Thing"})
    assert "missing" in registry and "other" not in registry and list(registry) == ["missing"]
    with pytest.raises(KeyError):
        registry["other"]
