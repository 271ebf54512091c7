"""Sliding windows over a client's split and scaled data, as tensors (the split and the scaling
themselves are numpy: ``edge_agent.data.arrays``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from edge_agent.data.arrays import RATIOS, ClientArrays, Ratios, StandardScaler, client_arrays
from edge_agent.scoring import Scale

if TYPE_CHECKING:
    from edge_agent.data.table import SeriesTable

TIME_FEATURES = 4
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def rows_from(values: torch.Tensor, first: torch.Tensor, length: int) -> torch.Tensor:
    """``values[first[b] + k]`` for k < ``length`` as one (B, length, C) tensor: a gather from the
    unfolded view, the same values as indexing with a (B, length) grid at a tenth of its cost (a
    training step's window gather on 10-minute data, a lookback of 1,008 rows: about 0.9 ms -> 0.1)."""
    if not len(first):
        return values.new_empty((0, length, values.shape[1]))
    return values.unfold(0, length, 1)[first].transpose(1, 2).contiguous()


@dataclass(eq=False)
class WindowSet:
    """Windows over one split: scaled series (rows, F), time features (rows, 4) and window start rows,
    plus how many windows were left out because they would cross a gap, how their errors are scored
    (``scale``; None: on the normalized scale, no MASE) and where the split's first row sits in its
    client's ``raw`` data (``offset``), so anchors can forecast the very same windows."""

    series: torch.Tensor
    marks: torch.Tensor
    starts: torch.Tensor
    lookback: int
    horizon: int
    dropped: int = 0
    scale: Scale | None = None
    offset: int = 0

    def __len__(self) -> int:
        """Number of windows."""
        return int(self.starts.numel())

    def batch(self, positions: torch.Tensor) -> Batch:
        """Gather windows number `positions` (indices into `starts`) as x (B, L, F), t (B, L, 4), y (B, H, F)."""
        first = self.starts[positions]
        return (rows_from(self.series, first, self.lookback), rows_from(self.marks, first, self.lookback),
                rows_from(self.series[self.lookback:], first, self.horizon))

    def batches(
        self, batch_size: int, shuffle: bool, generator: torch.Generator | None = None
    ) -> Iterator[Batch]:
        """Iterate over all windows in batches, in a random order when `shuffle`."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        order = torch.randperm(len(self), generator=generator) if shuffle else torch.arange(len(self))
        for chunk in order.split(batch_size):
            yield self.batch(chunk)

    def origins(self) -> np.ndarray:
        """Each window's first forecast row as a row of its client's ``raw`` data."""
        return self.offset + self.starts.numpy() + self.lookback

    def targets(self) -> torch.Tensor:
        """Every window's target (N, H, F) on the normalized scale."""
        return self.batch(torch.arange(len(self)))[2]


@dataclass(eq=False)
class ClientData:
    """One client's scaled, windowed data plus what is needed to undo the scaling and place it on a map,
    and its values in data units from the first row of its history on (``raw``, NaN where missing;
    the training rows come first) with the rows per season (``period``, a day), for the anchors."""

    name: str
    n_features: int
    columns: tuple[str, ...]
    scaler: StandardScaler
    latitude: float | None
    longitude: float | None
    train: WindowSet
    val: WindowSet
    test: WindowSet
    raw: np.ndarray
    period: int
    memo: dict = field(default_factory=dict, repr=False)  # anchors fitted and run once (edge_agent.selection)

    @property
    def history(self) -> np.ndarray:
        """The training rows the client has (data units): what anchors are fitted on."""
        return self.raw[: len(self.train.series)]

    @property
    def n_train(self) -> int:
        """Number of training windows: the sample count used for FedAvg weighting."""
        return len(self.train)


def prepare_client(
    table: SeriesTable,
    lookback: int,
    horizon: int,
    stride: int = 1,
    ratios: Ratios = RATIOS,
    val_stride: int = 1,
    history: int | None = None,
    test_stride: int = 1,
) -> ClientData:
    """Split, scale (fitted on present train rows only) and window one table.

    Train windows start every `stride` rows, validation windows every `val_stride` rows and test
    windows every `test_stride` rows (subsampling only saves compute: a benchmark scoring
    10-minute data at hourly origins estimates the every-row score). Windows that would cover a
    row with a missing value are left out. With `history`, only the last `history`
    rows of the training split are kept (a gateway that has collected only that much), while
    validation and test stay where they are. Errors are scored against the whole training split
    (``edge_agent.scoring.Scale``), so scores do not move with `history`.
    """
    return client_data(client_arrays(table, lookback, horizon, stride, ratios, val_stride, history, test_stride))


def client_data(arrays: ClientArrays) -> ClientData:
    """The windows of ``arrays`` as tensors (sharing their memory) and how their errors are scored."""
    series, marks = torch.from_numpy(arrays.scaled), torch.from_numpy(arrays.marks)
    scale = Scale.of(arrays.std, arrays.reference, arrays.period)
    sets = {
        split: WindowSet(series[a:b], marks[a:b], torch.from_numpy(arrays.starts[split]), arrays.lookback,
                         arrays.horizon, arrays.dropped[split], scale, a - arrays.train_start)
        for split, (a, b) in arrays.bounds.items()
    }
    return ClientData(arrays.name, len(arrays.columns), arrays.columns, StandardScaler(arrays.mean, arrays.std),
                      arrays.latitude, arrays.longitude, **sets, raw=arrays.raw, period=arrays.period)
