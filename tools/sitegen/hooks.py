"""mkdocs hooks (``hooks:`` in mkdocs.yml): the reference pages are generated from the code at every
build, never stored, so they cannot drift from it; ``docs/notes/*.md`` get an index page and the
benchmark pages show the committed plots of ``bench/results``."""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from tools.sitegen import cli_reference, config_reference, layout

ROOT = Path(__file__).resolve().parents[2]
RESULT_PLOTS = ROOT / "bench" / "results"  # served as benchmarks/results/*.png, the committed plots

GENERATED = {
    "reference/configuration.md": config_reference.render,
    "reference/cli.md": cli_reference.render,
    "reference/layout.md": layout.render,
}


def notes_index(docs_dir: Path) -> str:
    """A page linking every note in ``docs/notes`` (what each change means for a user)."""
    notes = sorted((docs_dir / "notes").glob("*.md"))
    items = [f"- [{path.stem}]({path.name})" for path in notes if path.name != "index.md"]
    return "# Notes\n\nShort notes on recent changes, before they are folded into the pages above.\n\n" + (
        "\n".join(items) if items else "No notes at the moment.") + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages to the build."""
    for path, render in GENERATED.items():
        files.append(File.generated(config, path, content=render()))
    files.append(File.generated(config, "notes/index.md", content=notes_index(Path(config.docs_dir))))
    for plot in sorted(RESULT_PLOTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/results/{plot.name}", abs_src_path=str(plot)))
    return files
