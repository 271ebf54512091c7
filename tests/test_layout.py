"""The package layout holds: no import cycle anywhere, and imports flow one way
(``edgefl -> coordinator -> edge_agent``, ``export -> edge_agent``), function-level imports included;
the configs and the command modules import no heavy library when they are imported, so bad input
is reported before torch loads."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("edge_agent", "coordinator", "export", "edgefl", "hw_profiles")
ALLOWED = {  # which first-party packages each package may import
    "edge_agent": {"edge_agent"},
    "hw_profiles": {"hw_profiles"},
    "coordinator": {"coordinator", "edge_agent"},
    "export": {"export", "edge_agent", "hw_profiles"},
    "edgefl": set(PACKAGES),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


TORCH_FREE = ("edge_agent.config", "coordinator.config", "coordinator.simulation.federation_config",
              "edgefl.cli", "edgefl.commands", "edgefl.simulate_cli")
"""Modules that load no heavy library when imported: the configs, and the commands' modules."""
TRAINING_AGENT = ("edge_agent.agent", "edge_agent.model_facts", "edge_agent.training_child", "edgefl.services")
"""The modules of the long-lived ``agent run`` process."""
HEAVY = {"torch", "pandas", "statsforecast", "onnxruntime", "matplotlib", "snntorch", "onnx", "nir", "h5py", "pvlib",
         "paho"}
TRAINING_AGENT_HEAVY = HEAVY - {"pandas", "onnxruntime", "paho"}  # its tables, the bundle it serves, MQTT


def executed(tree: ast.Module) -> list[ast.stmt]:
    """The statements that run when the module is imported: not function bodies, not ``if
    TYPE_CHECKING:`` blocks."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
            todo += [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
            todo += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append(node)
    return found


def imports(path: Path, known: dict[str, Path], at_import: bool = False) -> set[str]:
    """First-party modules ``path`` imports anywhere in its body (``at_import``: when it is
    imported, and third-party ones too); ``from a import b`` counts as an import of the submodule
    ``a.b`` when there is one, else of ``a``."""
    found = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for node in executed(tree) if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return found if at_import else {name for name in found if name.split(".")[0] in PACKAGES}


def loaded_by(name: str, known: dict[str, Path]) -> dict[str, str]:
    """Every module importing ``name`` loads -> the first-party module that imports it (its
    packages' ``__init__`` included, as Python runs them first)."""
    loaded, todo = {name: ""}, [name]
    while todo:
        module = todo.pop()
        parents = [".".join(module.split(".")[:end]) for end in range(1, module.count(".") + 1)]
        for target in [*parents, *(imports(known[module], known, at_import=True) if module in known else ())]:
            if target not in loaded:
                loaded[target] = module
                todo += [target] if target in known else []
    return loaded


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def cycle_in(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in sorted(edges):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            target = next(stack[-1], None)
            if target is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(target) == 1:
                return path[path.index(target):] + [target]
            elif not state.get(target) and target in edges:
                state[target] = 1
                path.append(target)
                stack.append(iter(sorted(edges[target])))
    return None


def test_there_is_no_import_cycle() -> None:
    edges = graph()
    assert len(edges) > 40  # the walk found the packages
    cycle = cycle_in(edges)
    assert cycle is None, " -> ".join(cycle)


def test_imports_flow_one_way() -> None:
    wrong = sorted(
        f"{source} imports {target}" for source, targets in graph().items() for target in targets
        if target.split(".")[0] not in ALLOWED[source.split(".")[0]]
    )
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_cycle_and_a_wrong_direction() -> None:
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle_in({"a": {"b"}, "b": set()}) is None
    assert "edge_agent" not in ALLOWED["edge_agent"] - {"edge_agent"} and "coordinator" not in ALLOWED["edge_agent"]


def heavy_chains(names: tuple[str, ...], heavy: set[str]) -> list[str]:
    """How importing each of ``names`` loads a library of ``heavy``: one import chain per library module."""
    known, chains = modules(), []
    for name in names:
        loaded = loaded_by(name, known)
        for target in sorted(target for target in loaded if target.split(".")[0] in heavy):
            chain = [target]
            while loaded[chain[-1]]:
                chain.append(loaded[chain[-1]])
            chains.append(" <- ".join(chain))
    return chains


def test_configs_and_commands_import_no_heavy_library() -> None:
    chains = heavy_chains(TORCH_FREE, HEAVY)
    assert not chains, "\n".join(chains)


def test_the_training_agents_modules_import_no_torch() -> None:
    """What the long-lived ``agent run`` process imports loads neither torch nor what the learners
    need; its child processes do (tests/test_live_gateway.py runs it where torch cannot be imported)."""
    chains = heavy_chains(TRAINING_AGENT, TRAINING_AGENT_HEAVY)
    assert not chains, "\n".join(chains)


def test_the_heavy_import_check_follows_packages_and_skips_function_bodies(tmp_path: Path) -> None:
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import torch\ndef f():\n    import pandas\n"
                     "try:\n    import numpy\nexcept ImportError:\n    import json\n")
    assert sorted(ast.unparse(node) for node in executed(tree)) == ["import json", "import numpy", "import os"]
    assert "edge_agent" in loaded_by("edge_agent.models.config", modules())
