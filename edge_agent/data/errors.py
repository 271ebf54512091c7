"""The data error type, apart from the tables so that torch- and pandas-free code can raise it."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """Bad input data: the message names the file/column and the reason."""


def file_not_found(path: Path) -> DataError:
    """The error for a data file (or folder) that is not there, as every loader and command says it."""
    return DataError(f"{path.name}: file not found ({path})")
