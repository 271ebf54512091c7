"""``edgefl demo`` piped, as a log takes it: a real broker, coordinator and two of the seven
stations' agents for two rounds (every agent imports torch and trains: two keep the test short)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

from coordinator.store import Store
from edgefl.demo import QUIET_S
from edgefl.init_fleet import edgefl_command

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SITES = ("sand_point", "greensboro")  # the first two bundled sites (list_sites): --stations 2


def run_piped(*args: str, timeout: float = 1800) -> tuple[int, list[tuple[float, str]]]:
    """Run ``edgefl`` with its output piped; its exit status and each line with when it was read."""
    process = subprocess.Popen([sys.executable, "-m", "edgefl.cli", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines, deadline = [], time.time() + timeout
    for line in process.stdout:
        lines.append((time.time(), line.rstrip("\n")))
        assert time.time() < deadline, "the demo ran past its time"
    return process.wait(60), lines


def index_of(lines: list[str], start: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(start))


def panels(png: Path) -> str:
    """The panels a PNG of the demo says it has (its Description text chunk)."""
    with Image.open(png) as image:
        return image.text["Description"]


def test_a_piped_demo_says_each_stage_and_round_as_it_happens_then_draws_and_points_onward(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    status, timed = run_piped("demo", "--rounds", "2", "--stations", "2", "--out", str(out))
    lines = [line for _, line in timed]
    assert status == 0, "\n".join(lines)
    stages = [index_of(lines, s) for s in ("starting mosquitto", "broker up on 127.0.0.1:", "coordinator up: campaign",
                                           "2/2 agents registered")]
    assert stages == sorted(stages)
    rounds = [index_of(lines, f"round {n}; clients 2; accepted ") for n in (1, 2)]
    assert stages[-1] < rounds[0] < rounds[1] < index_of(lines, "forecasting each station's last test days")
    said = [at for at, _ in timed[stages[-1]:rounds[1] + 1]]  # never silent for long while rounds run
    assert max(b - a for a, b in zip(said, said[1:])) < 2 * QUIET_S, timed[stages[-1]:rounds[1] + 1]
    for n in rounds:  # the fleet's mean validation MASE, of the federated model and of what is served
        found = re.search(r"train loss \d+\.\d+; val MASE federated (\d+\.\d+); val MASE served (\d+\.\d+);", lines[n])
        federated, served = found.groups()
        assert 0 < float(served) <= float(federated) + 1e-4
    for site in SITES:  # what each station serves, as its forecast is drawn
        assert any(line.startswith(f"  {site}: served by ") for line in lines[rounds[1]:]), site
    store = Store(out / "state" / "coordinator")
    closed = {row.round: row.closed_at for row in store.rounds()}
    store.close()
    assert timed[rounds[0]][0] < closed[2]  # round 1's line was out before round 2 closed

    curve, forecasts = out / "training_curve.png", out / "forecasts.png"
    for png in (curve, forecasts):
        assert png.read_bytes()[:8] == PNG_SIGNATURE
    assert panels(curve) == "panels: training loss, validation MASE"
    assert sorted(panels(forecasts).removeprefix("panels: ").split(", ")) == sorted(SITES)

    after = lines[index_of(lines, "look next:"):]
    edgefl = shlex.join(edgefl_command())  # the install's own script: runs with no virtualenv active
    command = f"{edgefl} coordinator status -c {out / 'broker' / 'coordinator.toml'}"
    for expected in (str(curve), str(forecasts), command, f"{edgefl} agent forecast -c {out / 'broker'}",
                     str(out / "logs"), "dashboard: http://127.0.0.1:"):
        assert any(expected in line for line in after), expected
    bare = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"} | {"PATH": "/usr/bin:/bin"}
    shown = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120, env=bare)
    assert shown.returncode == 0 and "closed" in shown.stdout, shown.stderr
