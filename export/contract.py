"""What every exporter (ONNX, NIR, Lava netx) shares: one signature, one report, one mismatch error.

An exporter is ``export_<format>(model, out, windows, n_windows, *, <format options>) -> ExportReport``
(``Exporter``): it writes ``out`` (a folder for ONNX, a file otherwise), runs what it wrote on up to
``n_windows`` real windows spread over ``windows`` and raises ``ExportMismatchError`` unless the
artefact reproduces the torch model there. A model the format cannot express raises
``export.stack.UnsupportedLayerError``. Either way ``out`` receives verified files only
(``verified_write``, ``verified_folder``): a failed export leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from edge_agent.data import WindowSet
from edge_agent.models import Forecaster


class ExportMismatchError(RuntimeError):
    """The exported artefact does not reproduce the torch model on real windows; the message says
    where (graph, output or layer) and by how much."""


@dataclass
class ExportReport:
    """What an exporter wrote and how closely the written artefact reproduced the model; plain
    values only, so ``as_dict`` goes straight to JSON."""

    format: str  # "onnx", "nir" or "lava"
    files: list[str]  # every file written, as paths
    windows: int  # real windows the artefact was run on
    spike_agreement: float | None = None  # fraction of spikes equal to the reference (None: no spikes)
    max_abs_error: float | None = None  # largest forecast difference (None: the artefact has no forecast)
    steps: int | None = None  # spiking time steps T
    layers: list[dict[str, Any]] = field(default_factory=list)  # per exported layer, "name" first
    firing_rates: dict[str, float] = field(default_factory=dict)  # mean spikes per node or layer
    timings_ms: dict[str, float] = field(default_factory=dict)  # median ms per batch of ``windows``
    details: dict[str, Any] = field(default_factory=dict)  # format-specific figures (see each exporter)
    notes: list[str] = field(default_factory=list)  # caveats a reader of the figures needs

    def as_dict(self) -> dict[str, Any]:
        """The report as nested dicts and lists (for JSON)."""
        return dataclasses.asdict(self)


class Exporter(Protocol):
    """The shared signature; format options follow as keyword-only arguments with defaults."""

    def __call__(self, model: Forecaster, out: Path, windows: WindowSet, n_windows: int = ...) -> ExportReport: ...


def sample_windows(windows: WindowSet, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, marks) of up to ``n_windows`` windows spread evenly over ``windows``, float32."""
    if len(windows) == 0 or n_windows < 1:
        raise ValueError(f"no windows to verify the export on ({len(windows)} available, {n_windows} asked for)")
    positions = torch.linspace(0, len(windows) - 1, min(n_windows, len(windows))).round().long().unique()
    x, marks, _ = windows.batch(positions)
    return x.float(), marks.float()


@contextmanager
def verified_write(path: Path) -> Iterator[Path]:
    """Yield a scratch path beside ``path`` to write and check; it replaces ``path`` only when the
    block succeeds, so ``path`` only ever holds a verified file (or whatever it held before)."""
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(path)


@contextmanager
def verified_folder(folder: Path) -> Iterator[Path]:
    """``verified_write`` for an exporter that writes several files: yield an empty scratch folder
    (in the system's temporary folder) to write and check them in; they move into ``folder``
    (made then) only when the block succeeds, so a failed export leaves nothing behind."""
    with tempfile.TemporaryDirectory(prefix="edgefl-export-") as scratch:
        yield Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for path in Path(scratch).iterdir():
            shutil.move(path, folder / path.name)
