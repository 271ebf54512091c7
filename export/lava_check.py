"""A second check of a netx file by Lava itself: its own netx loader and bit-accurate fixed-point
simulator (``Loihi2SimCfg(select_tag="fixed_pt")``), run in the separate venv ``make lava-venv``
builds (Lava cannot install beside edgefl), compared layer by layer with ``simulate_cuba``."""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RUNNER = Path(__file__).resolve().parents[1] / "tools" / "lava" / "run_netx.py"
DEFAULT_VENV = Path(".lava-venv")


class LavaUnavailableError(RuntimeError):
    """The Lava venv is missing or broken; the message says how to build it."""


@dataclass(frozen=True)
class LavaCheck:
    """Per dense layer: the share of (step, position, neuron) entries where Lava's spikes equal
    ``simulate_cuba``'s, and how many spikes each emitted."""

    agreement: list[float]
    lava_spikes: list[int]
    our_spikes: list[int]
    positions: int
    seconds: float  # Lava's run time


def lava_python(venv: Path = DEFAULT_VENV) -> Path:
    python = venv / "bin" / "python"
    if not (venv / ".built").is_file() or not python.is_file():
        raise LavaUnavailableError(f"no Lava venv at {venv}: build it once with `make lava-venv` (needs PyPI, minutes)")
    if not RUNNER.is_file():
        raise LavaUnavailableError(f"{RUNNER} is missing: --verify-in-lava runs from a source checkout of edgefl")
    return python


def run_in_lava(path: Path, spikes: np.ndarray, ours: list[np.ndarray], venv: Path = DEFAULT_VENV,
                timeout_s: float = 1800) -> LavaCheck:
    """Run netx file ``path`` on input spikes (T, N, d_in) in Lava and compare every dense layer's
    spikes with ``ours`` (``simulate_cuba``'s on the same input)."""
    python = lava_python(venv)
    with tempfile.TemporaryDirectory() as folder:
        inputs, outputs = Path(folder) / "in.npz", Path(folder) / "out.npz"
        np.savez(inputs, spikes=spikes)
        done = subprocess.run([str(python), str(RUNNER), str(path), str(inputs), str(outputs)],
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode:
            raise LavaUnavailableError(f"Lava's run of {path} failed: {done.stderr.strip()[-2000:]}")
        with np.load(outputs) as saved:
            lava = [saved[f"layer{index}"] for index in range(1, len(saved.files))]
            seconds = float(saved["seconds"])
    if len(lava) != len(ours):
        raise LavaUnavailableError(f"Lava ran {len(lava)} dense layers of {path}, the file has {len(ours)}")
    return LavaCheck([float((a == b).mean()) for a, b in zip(lava, ours)], [int(a.sum()) for a in lava],
                     [int(b.sum()) for b in ours], spikes.shape[1], seconds)
