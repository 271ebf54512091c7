"""Crash-safe local files: write to a temporary file, fsync, rename, fsync the folder. torch is
imported only by the tensor helpers, and only for torch tensors, so the serving-only process and
the training agent can use this module."""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge_agent.tensors import TensorDict


class StateDirError(OSError):
    """A state folder that cannot be created or written; the message names the path."""


def writable_folder(folder: Path, what: str = "state_dir") -> Path:
    """``folder``, created if missing, after proving a file can be made in it; else a
    ``StateDirError`` naming ``what``, the path and the reason (read-only, not a folder, ...)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise StateDirError(f"{what} {folder} is not a writable folder: {err.strerror or err}") from None
    return folder


def write_bytes_atomically(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file.

    The file has ``mode`` (less the umask) from its first byte: a new temporary file (``O_EXCL``:
    never an existing file or link) is written, fsynced, renamed over ``path``, and the folder
    fsynced so the rename itself survives a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written temporary file behind
        raise
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make renames inside ``folder`` durable."""
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


def write_tensors_atomically(path: Path, tensors: TensorDict) -> None:
    """Save tensors (torch's or numpy arrays) as a safetensors file, atomically."""
    from edge_agent.tensors import tensors_to_bytes

    write_bytes_atomically(path, tensors_to_bytes(tensors))


def write_tagged_tensors(path: Path, tensors: TensorDict, tag: str, metadata: dict[str, str]) -> None:
    """Save tensors with string metadata and ``format`` = ``tag``, atomically (read back by
    ``read_tagged_tensors``)."""
    from edge_agent.tensors import tensors_to_bytes

    write_bytes_atomically(path, tensors_to_bytes(tensors, metadata={"format": tag, **metadata}))


def read_tagged_tensors(path: Path, tag: str, error: type[ValueError] = ValueError) -> tuple[TensorDict, dict[str, str]]:
    """Tensors and string metadata of a safetensors file whose ``format`` metadata is ``tag``.

    Never unpickles. Raises ``error`` naming the file when it is missing, unreadable or of
    another format."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: not found")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise error(f"{path}: not a readable safetensors file ({err})") from None
    if metadata.get("format") != tag:
        raise error(f"{path}: format is {metadata.get('format')!r}, expected {tag!r}")
    return tensors, metadata
