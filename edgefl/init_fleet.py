"""``edgefl init DIR``: a fleet folder that runs as it is (the role of Flower's ``flwr new``): the
broker's config, passwords, ACL and persistence folder, coordinator.toml, one agent.toml per
gateway (each with the fleet's ``[model]``), one systemd unit per process, and the commands."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from coordinator.broker_setup import BROKER_ACCOUNT, broker_user, write_fleet_setup

RESTART_NEVER = (3, 4)  # refused for good (edge_agent.refusals), campaign finished (coordinator.server)


@dataclass(frozen=True)
class Fleet:
    """What ``init`` wrote: every process's command line and where its unit is."""

    folder: Path
    name: str
    commands: dict[str, list[str]]
    units: dict[str, Path]


def edgefl_command() -> list[str]:
    """How to run this edgefl from any shell (no virtualenv active): the console script installed
    beside this Python, else the one on PATH, else this Python with ``-m edgefl.cli``."""
    beside = Path(sys.executable).parent / "edgefl"
    script = str(beside) if beside.is_file() else shutil.which("edgefl")
    return [script] if script else [sys.executable, "-m", "edgefl.cli"]


def init_fleet(folder: Path, fleet: str, agents: int, rounds: int, host: str, port: int,
               round_timeout_s: float) -> Fleet:
    """Write the fleet folder; refuses a folder that holds anything (a fleet's keys are never overwritten)."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder}: exists and is not an empty folder; name a new one (init never overwrites a fleet)")
    ids = [f"agent{i:02d}" for i in range(1, agents + 1)]
    written = write_fleet_setup(fleet, ids, folder.resolve(), host, port, coordinator_settings={
        "rounds": rounds, "round_timeout_s": round_timeout_s})
    edgefl = edgefl_command()
    commands = {"broker": [shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(written["mosquitto.conf"])],
                "coordinator": [*edgefl, "coordinator", "serve", "--config", str(written["coordinator.toml"])],
                **{agent: [*edgefl, "agent", "run", "--config", str(written[f"{agent}.toml"])] for agent in ids}}
    units = write_units(folder.resolve() / "systemd", fleet, commands)
    return Fleet(folder.resolve(), fleet, commands, units)


def write_units(folder: Path, fleet: str, commands: dict[str, list[str]]) -> dict[str, Path]:
    """One systemd unit per process: the broker first, the coordinator after it, the agents after both."""
    folder.mkdir()
    units = {}
    for process, command in commands.items():
        after = "" if process == "broker" else f" edgefl-{fleet}-broker.service"
        after += f" edgefl-{fleet}-coordinator.service" if process not in ("broker", "coordinator") else ""
        units[process] = folder / f"edgefl-{fleet}-{process}.service"
        units[process].write_text("\n".join([
            "[Unit]", f"Description=edgefl fleet {fleet}: {process}", f"After=network-online.target{after}",
            "Wants=network-online.target", "", "[Service]", f"ExecStart={shlex.join(command)}",
            "Restart=on-failure", f"RestartPreventExitStatus={' '.join(map(str, RESTART_NEVER))}",
            *(["ExecReload=/bin/kill -HUP $MAINPID"] if process == "broker" else []),
            "", "[Install]", "WantedBy=multi-user.target", "",
        ]))
    return units


def closed_parents(folder: Path) -> list[Path]:
    """The folders above ``folder`` that the broker's account cannot enter (root only: the
    broker drops to that account, which must reach its files)."""
    if os.geteuid() != 0 or broker_user() != BROKER_ACCOUNT:
        return []
    return [p for p in folder.parents if not os.stat(p).st_mode & stat.S_IXOTH]


def instructions(fleet: Fleet) -> list[str]:
    """What ``init`` prints: what it wrote, then the exact commands to run."""
    shown = {process: shlex.join(command) for process, command in fleet.commands.items()}
    names = " ".join(unit.stem for unit in fleet.units.values())
    return [
        f"wrote fleet {fleet.name!r} in {fleet.folder}: coordinator.toml, agents/*.toml (each with [model]), "
        f"mosquitto.conf + passwords + acl + data/ (the broker runs as {broker_user()}), systemd/*.service",
        "", "run it, each command in its own terminal (the broker first):",
        *(f"  {line}" for line in shown.values()),
        "", "or as services:",
        f"  sudo cp {fleet.folder / 'systemd'}/*.service /etc/systemd/system/ && sudo systemctl daemon-reload",
        f"  sudo systemctl enable --now {names}",
        "", "watch it:", f"  {shlex.join(edgefl_command())} coordinator status --config {fleet.folder / 'coordinator.toml'}",
    ]
