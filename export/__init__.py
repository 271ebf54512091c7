"""Neuromorphic export (ONNX, Lava netx, NIR) and operation counting; imports edge_agent only.

Every exporter follows ``export.contract``; ``exporter(fmt)`` finds one by its format name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from export.contract import Exporter

FORMATS = ("onnx", "nir", "lava")


def exporter(fmt: str) -> Exporter:
    """``export.<fmt>.export_<fmt>``, imported on first use: each format loads its own runtime
    (onnxruntime, nir, h5py), which ``export.opcount`` and the other formats do not need."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    return getattr(importlib.import_module(f"export.{fmt}"), f"export_{fmt}")
