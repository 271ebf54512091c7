"""Crash-safe local files: write to a temporary file, fsync, rename, fsync the folder."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save

TensorDict = dict[str, torch.Tensor]


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_tensors_atomically(path: Path, tensors: TensorDict) -> None:
    """Save tensors as a safetensors file, atomically."""
    write_bytes_atomically(path, save({k: v.contiguous() for k, v in tensors.items()}))
