"""The documentation site: it builds with warnings as errors, its generated reference lists every
configuration key and every command, its layout page every module, and the tutorials' marked
commands run and print what their pages show."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from tools.sitegen import cli_reference, config_reference, layout
from tools.sitegen.runnable import missing, pages, runnables

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIALS = pages(DOCS)
README_MAX_LINES = 150
COMMAND_TIMEOUT_S = 360  # a tutorial command trains; CI machines are small and loaded


def site_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1", "COLUMNS": "200"}  # wide: no wrapped lines


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
                          cwd=ROOT, env=site_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("reference/configuration", "reference/cli", "reference/layout", "tutorials/first-fleet"):
        assert (tmp_path / page / "index.html").is_file(), page
    assert (tmp_path / "benchmarks" / "results" / "fedgame.png").is_file()  # bench/results plots served


def resolved(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def schema_keys(schema: dict, node: dict, prefix: str = "") -> set[str]:
    """Every key path of a JSON schema: an independent walk of what pydantic accepts."""
    found = set()
    for name, prop in resolved(schema, node).get("properties", {}).items():
        path = f"{prefix}{name}"
        found.add(path)
        for option in [prop, *prop.get("anyOf", []), *prop.get("allOf", [])]:
            option = resolved(schema, option)
            if option.get("type") == "array" and "items" in option:
                found |= schema_keys(schema, option["items"], f"{path}[].")
            elif "properties" in option:
                found |= schema_keys(schema, option, f"{path}.")
    return found


def page_keys(page: str, filename: str) -> set[str]:
    section = page.split(f"## {filename}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


@pytest.mark.parametrize("filename", ["agent.toml", "coordinator.toml", "aggregator.toml"])
def test_configuration_reference_lists_every_key(filename: str) -> None:
    model: type[BaseModel] = config_reference.config_models()[filename]
    schema = model.model_json_schema()
    listed = page_keys(config_reference.render(), filename)
    expected = schema_keys(schema, schema)
    assert {"fleet", "broker.host", "model.lookback"} <= expected  # the walk reaches nested tables
    assert listed == expected, (sorted(expected - listed), sorted(listed - expected))


def test_configuration_reference_shows_types_defaults_and_meanings() -> None:
    rows = {key.path: key for key in config_reference.keys(config_reference.config_models()["coordinator.toml"])}
    assert rows["rounds"].type == "int (>= 1, <= 1000000)" and rows["rounds"].default == "10"
    assert rows["registration"].type == '"open" | "closed"' and rows["registration"].default == '"open"'
    assert rows["fleet"].default == "required"
    assert rows["store.url"].meaning.startswith("postgresql://")
    assert rows["store"].meaning  # a table without a description: its model's docstring
    agent = {key.path: key for key in config_reference.keys(config_reference.config_models()["agent.toml"])}
    assert agent["sensors.features[].topic"].type == "str (length >= 1)"  # [[sensors.features]] entries


@pytest.mark.parametrize("filename", ["agent.toml", "coordinator.toml", "aggregator.toml"])
def test_configuration_reference_gives_every_key_a_meaning(filename: str) -> None:
    keys = config_reference.keys(config_reference.config_models()[filename])
    assert len(keys) > 100  # the walk reaches the nested tables
    assert [key.path for key in keys if not key.meaning.strip()] == []


def test_cli_reference_lists_every_command_and_option() -> None:
    tree = cli_reference.command_tree()
    page = cli_reference.render(tree)
    paths = cli_reference.command_paths(tree)
    assert {"edgefl simulate", "edgefl coordinator serve", "edgefl export lava"} <= set(paths)
    headings = set(re.findall(r"^#+ `(.+)`$", page, flags=re.MULTILINE))
    assert set(paths) - {"edgefl"} <= headings
    simulate = page.split("`edgefl simulate`", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{opt}" in simulate for param in tree.commands["simulate"].params for opt in param.opts)


def test_layout_lists_every_module_and_every_top_level_folder() -> None:
    page = layout.render()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {line.split("/", 1)[0] for line in tracked.splitlines() if "/" in line}
    assert folders == set(layout.FOLDERS), "every top-level folder needs a line in tools/sitegen/layout.py FOLDERS"
    for name in layout.DESCRIBED:
        for module in (ROOT / name).rglob("*.py"):
            shown = module.parent if module.name == "__init__.py" else module
            if "results" not in module.parts:
                assert f"`{shown.relative_to(ROOT)}{'/' if shown.is_dir() else ''}`" in page, module


def test_readme_is_short_and_its_links_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) > 20
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_marked_blocks_are_found_and_output_compared() -> None:
    page = "\n".join(["<!-- run -->", "```bash", "echo hi", "```", "", "<!-- output -->", "```text",
                      "a  b ... d", "...", "```", "<!-- run -->", "```bash", "true", "```"])
    first, second = runnables(page)
    assert (first.command, first.expected, second.expected) == ("echo hi", ("a  b ... d",), ())
    assert missing(first.expected, "x\na b c d\n") == []
    assert missing(first.expected, "a b\nc d\n") == ["a  b ... d"]
    with pytest.raises(ValueError, match="followed by a fenced block"):
        runnables("<!-- run -->\nno block here\n")
    with pytest.raises(ValueError, match="must follow a run block"):
        runnables("<!-- output -->\n```\nx\n```\n")


def repository_view(folder: Path) -> Path:
    """A folder that looks like the repository root (every top-level entry linked) and keeps
    what the commands write, so the pages' relative paths work and the checkout stays clean."""
    for entry in ROOT.iterdir():
        if entry.name not in (".git", "site"):
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.mark.parametrize("page", sorted(TUTORIALS))
def test_tutorial_commands_run_and_print_what_the_page_shows(page: str, tmp_path: Path) -> None:
    cwd = repository_view(tmp_path)
    for block in TUTORIALS[page]:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.command], cwd=cwd, env=site_env(),
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{page}:{block.line}: exit {done.returncode}\n{output[-2000:]}"
        assert missing(block.expected, output) == [], f"{page}:{block.line}: printed\n{output[-3000:]}"
