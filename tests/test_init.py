"""``edgefl init DIR`` and then the commands it prints, as a user pastes them: a real mosquitto
started from the generated config (as root it drops to the mosquitto user), the coordinator and
two agents, until the campaign's last round closes; the broker keeps its database across a
restart as the mosquitto user."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from coordinator.broker_setup import free_port, wait_for_port
from coordinator.server import FINISHED_EXIT_CODE
from edge_agent.config import dump_toml
from tests.fleet import STARTED
from tests.test_cli import edgefl

TINY = {"lookback": 24, "horizon": 12}
QUICK = {"min_steps": 0, "anchors": [], "keep_local": False, "median": False, "stride": 24, "batch_size": 64}


@pytest.fixture
def open_folder():
    """A folder the mosquitto user can enter (pytest's tmp_path is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="edgefl-init-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def printed_commands(stdout: str) -> list[list[str]]:
    """The lines under "run it, ..." up to the next blank line, as argument lists."""
    block = stdout.split("run it, each command in its own terminal (the broker first):\n", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line) for line in block.splitlines()]


def shrink(path: Path, **settings: object) -> None:
    """The user's edit: a tiny model (the same [model] on every side), quick local training, a
    coordinator that starts when both agents are there and lingers briefly at the end."""
    config = tomllib.loads(path.read_text())
    config["model"].update(TINY)
    path.write_text(dump_toml({**config, **settings}))


def run(command: list[str], log: Path) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    STARTED.append(process)
    return process


def test_init_then_the_printed_commands_run_a_fleet_to_its_last_round(open_folder: Path) -> None:
    fleet, port = open_folder / "fleet", free_port()
    proc = edgefl("init", str(fleet), "--agents", "2", "--rounds", "2", "--round-timeout-s", "30", "--port", str(port))
    assert proc.returncode == 0, proc.stderr
    broker, coordinator, *agents = printed_commands(proc.stdout)
    assert broker[-2:] == ["-c", str(fleet / "mosquitto.conf")] and len(agents) == 2
    assert {p.name for p in (fleet / "systemd").iterdir()} == {
        "edgefl-farm-broker.service", "edgefl-farm-coordinator.service",
        "edgefl-farm-agent01.service", "edgefl-farm-agent02.service"}
    assert "coordinator status --config" in proc.stdout
    shrink(fleet / "coordinator.toml", start_clients=2, linger_s=3.0)
    for agent in sorted((fleet / "agents").iterdir()):
        assert "model" in tomllib.loads(agent.read_text())  # written with [model]: nothing to merge
        shrink(agent, training=QUICK)

    mosquitto = run(broker, open_folder / "broker.log")
    wait_for_port(port, mosquitto)
    started = time.monotonic()
    services = [run(coordinator, open_folder / "coordinator.log"),
                *(run(agent, open_folder / f"agent{i}.log") for i, agent in enumerate(agents))]
    for service in services:
        service.wait(300)
    print(f"fleet ran in {time.monotonic() - started:.1f} s")
    logs = "\n".join(p.read_text() for p in open_folder.glob("*.log"))
    assert [s.returncode for s in services] == [0, 0, 0], logs
    assert "round   2 closed: 2 accepted" in (open_folder / "coordinator.log").read_text(), logs

    again = subprocess.run(coordinator, capture_output=True, text=True, timeout=120)
    assert again.returncode == FINISHED_EXIT_CODE, again.stderr
    assert again.stderr.splitlines()[-1].startswith("error: campaign ") and "finished with round 2" in again.stderr
    assert "start the next campaign with an empty state_dir" in " ".join(again.stderr.split())

    database = fleet / "data" / "mosquitto.db"
    mosquitto.send_signal(signal.SIGTERM)
    assert mosquitto.wait(30) == 0 and database.is_file(), (open_folder / "broker.log").read_text()
    if os.geteuid() == 0 and shutil.which("setpriv"):
        assert pwd.getpwuid(database.stat().st_uid).pw_name == "mosquitto"  # it ran as mosquitto
        saved = database.stat().st_mtime_ns
        as_user = run(["setpriv", "--reuid=mosquitto", "--regid=mosquitto", "--init-groups", *broker],
                      open_folder / "broker-user.log")
        wait_for_port(port, as_user)
        as_user.send_signal(signal.SIGTERM)
        assert as_user.wait(30) == 0, (open_folder / "broker-user.log").read_text()
        assert database.stat().st_mtime_ns > saved and "Saving in-memory database" in (
            open_folder / "broker-user.log").read_text()


def test_init_refuses_a_folder_that_holds_anything(tmp_path: Path) -> None:
    (tmp_path / "coordinator.toml").write_text("")
    proc = edgefl("init", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"error: {tmp_path}: exists and is not an empty folder; name a new one (init never " \
                          "overwrites a fleet)\n"
