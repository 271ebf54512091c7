"""The one interface every backbone implements."""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol

from torch import nn


class BackboneSizes(Protocol):
    """What a backbone reads of the model config (``ModelConfig`` provides it; the backbones do
    not import the config, which validates backbone names against their registry)."""

    lookback: int
    horizon: int
    d_qap: int
    dropout: float
    steps: int
    moving_avg: int

    def size(self, name: str, default: int) -> int: ...


class Backbone(nn.Module):
    """Maps the aligned sequence (B, L, d_qap) to a representation (B, A, C) for the head.

    ``out_shape`` is (A, C). Backbones carry no forecast head of their own: FedPer keeps the
    head personal (FedQAPer A.5), so the read-out lives in ``PersonalHead``.
    """

    kind: ClassVar[Literal["ann", "snn"]] = "ann"
    out_shape: tuple[int, int]
