"""The requirement sets the platform checks install, with the versions pinned in pyproject.toml
(one place for every pin)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What `edgefl agent serve` imports today. Issue 28 item 1 makes this the `serve` extra (numpy,
# onnxruntime, paho-mqtt, pydantic; no pandas): then install `edgefl[serve]` instead.
SERVE = ("numpy", "onnxruntime", "paho-mqtt", "pydantic", "typer", "rich", "tomli-w", "pandas")
BUILD = ("setuptools==84.2.1",)  # builds the package without build isolation (pyproject: setuptools>=77)


def project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _name(requirement: str) -> str:
    return re.split(r"[\s=<>!~;\[]", requirement, maxsplit=1)[0].lower()


def pinned() -> dict[str, str]:
    """Every requirement of the package and its extras, by distribution name."""
    found = {_name(r): r.split(";")[0].strip() for r in project()["dependencies"]}
    for extra in project()["optional-dependencies"].values():
        found.update({_name(r): r.split(";")[0].strip() for r in extra if not r.startswith("edgefl")})
    return found


def pins(names: tuple[str, ...]) -> list[str]:
    """``names`` with the versions pyproject.toml pins them at."""
    table = pinned()
    return [table[name] for name in names]


def extra(name: str) -> list[str]:
    """The requirements of the package's extra ``name``, the extras it names (``edgefl[serve]``) expanded."""
    found = []
    for requirement in project()["optional-dependencies"][name]:
        nested = re.fullmatch(r"edgefl\[([\w,]+)\]", requirement.strip())
        found += [r for inner in nested.group(1).split(",") for r in extra(inner)] if nested else [requirement]
    return [r.split(";")[0].strip() for r in found]


def gateway() -> list[str]:
    """What a training gateway installs, ``edgefl[gateway]`` (train and serve: torch included)."""
    return [r.split(";")[0].strip() for r in project()["dependencies"]] + extra("gateway")
