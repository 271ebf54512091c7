"""The one interface every aggregator implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

TensorDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ClientUpdate:
    """The shared parameters one client sent for a round, with its training sample count."""

    client_id: str
    params: TensorDict
    n_samples: int


class Aggregator(ABC):
    """Turns a round's client updates into the next global shared parameters."""

    name: ClassVar[str]

    @abstractmethod
    def aggregate(self, updates: Sequence[ClientUpdate]) -> TensorDict:
        """Combine ``updates`` (at least one) into new global shared parameters."""
