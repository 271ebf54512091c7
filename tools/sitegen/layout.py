"""The layout page, generated from the source tree: every top-level folder with its role, and
every Python module with the first sentence of its docstring, so the page lists what is there."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {  # every top-level folder of the repository and what it is for
    "edge_agent": "the gateway side, importing nothing else of edgefl",
    "coordinator": "the service and the federated methods (imports edge_agent)",
    "export": "ONNX, NIR and Lava netx exporters with their verifying simulators, operation counts, energy",
    "edgefl": "the `edgefl` command line and `edgefl demo` (imports everything)",
    "hw_profiles": "energy per operation per hardware target, every number with its source",
    "bench": "paper reproductions, speed and robustness measurements; results/ holds their outputs",
    "tests": "the test suite (`make test`)",
    "tools": "the separate Lava venv (tools/lava) and this site's generators (tools/sitegen)",
    "deploy": "systemd units for the coordinator and an agent",
    "docs": "this site's pages",
    ".ci": "the CI entry point (runs `make test`)",
}
SKIPPED = {"__pycache__", "results", ".cache"}  # outputs, not source
DESCRIBED = ("edge_agent", "coordinator", "export", "edgefl", "hw_profiles", "bench", "tools")


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line ('' without one)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return " ".join(doc.split("\n\n")[0].split())


def top_level_folders(root: Path = ROOT) -> set[str]:
    """The repository's top-level folders that hold tracked-looking content (no caches or venvs)."""
    skip = {".git", ".venv", ".lava-venv", "runs", "site", "build", ".pytest_cache", "__pycache__"}
    return {p.name for p in root.iterdir() if p.is_dir() and p.name not in skip and not p.name.endswith(".egg-info")}


def module_lines(folder: Path, root: Path = ROOT, depth: int = 0) -> list[str]:
    """One markdown list item per Python module and per profile, script or unit file of ``folder``,
    subpackages nested under their own item (described by their ``__init__``)."""
    lines, indent = [], "    " * depth
    entries = sorted(folder.iterdir(), key=lambda p: (p.is_dir(), p.name))
    for path in entries:
        relative = path.relative_to(root)
        if path.is_dir() and path.name not in SKIPPED and any(path.rglob("*.py")):
            init = path / "__init__.py"
            text = summary(init) if init.exists() else ""
            lines.append(f"{indent}- `{relative}/`" + (f": {text}" if text else ""))
            lines += module_lines(path, root, depth + 1)
        elif path.suffix == ".py" and path.name != "__init__.py":
            text = summary(path)
            lines.append(f"{indent}- `{relative}`" + (f": {text}" if text else ""))
        elif path.suffix in (".toml", ".sh", ".service"):
            lines.append(f"{indent}- `{relative}`")
    return lines


def render(root: Path = ROOT) -> str:
    """The whole layout page."""
    parts = ["# Layout\n",
             "Generated from the source tree at every build of this site (`tools/sitegen/layout.py`): each "
             "module with the first sentence of its docstring.\n",
             "Imports flow one way: `edgefl -> coordinator -> edge_agent`, `export -> edge_agent`, with no "
             "import cycle anywhere; `tests/test_layout.py` walks every import (function-level ones too) and "
             "fails on a cycle or a wrong direction. Adding a federated method is one module in "
             "`coordinator/strategies/` plus one registry line; a twin forecaster, a backbone or a learner "
             "likewise in its own registry.\n",
             "## Folders\n", "| folder | what it holds |", "| --- | --- |"]
    parts += [f"| `{name}/` | {role} |" for name, role in FOLDERS.items()]
    for name in DESCRIBED:
        parts += ["", f"## {name}/\n", FOLDERS[name] + ".\n", *module_lines(root / name, root)]
    return "\n".join(parts) + "\n"
