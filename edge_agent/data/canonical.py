"""A station's windows on a fixed layout of variables (the foundation model's), for FedPoD."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from edge_agent.data.errors import DataError
from edge_agent.data.windows import prepare_client
from edge_agent.rows_needed import DEVICE_HORIZON

if TYPE_CHECKING:
    from edge_agent.data.table import SeriesTable



@dataclass(frozen=True)
class DeviceSeries:
    """One device's windows on the canonical variable layout and which variables it measures."""

    name: str
    train: torch.Tensor  # (N, window, V), standardized, unmeasured variables zero
    val: torch.Tensor
    test: torch.Tensor
    present: torch.Tensor  # (V,) bool


def canonical_index(table: SeriesTable, variables: tuple[str, ...]) -> torch.Tensor:
    """Position of each of ``table``'s columns in ``variables``; a column not among them is refused by name."""
    unknown = [c for c in table.columns if c not in variables]
    if unknown:
        raise DataError(f"{table.name}: variables {unknown} are not in the foundation model's {list(variables)}")
    return torch.tensor([variables.index(c) for c in table.columns])


def device_series(table: SeriesTable, variables: tuple[str, ...], window: int, stride: int) -> DeviceSeries:
    """Window ``table`` (its own scaler, fitted on training rows) into ``window``-long windows
    placed on ``variables``; unmeasured variables are zero and flagged absent in ``present``."""
    index = canonical_index(table, variables)
    data = prepare_client(table, window, DEVICE_HORIZON, stride, val_stride=stride)
    present = torch.zeros(len(variables), dtype=torch.bool)
    present[index] = True

    def canonical(windows) -> torch.Tensor:
        x, _, _ = windows.batch(torch.arange(len(windows)))
        out = torch.zeros(*x.shape[:2], len(variables))
        out[..., index] = x.float()
        return out

    return DeviceSeries(table.name, canonical(data.train), canonical(data.val), canonical(data.test), present)
