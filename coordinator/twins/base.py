"""The one interface every twin forecaster implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from edge_agent.tensors import TensorDict


class TwinForecaster(ABC):
    """Forecasts a missing client's shared parameters from its observed history (oldest first).

    Returns None when the client cannot be imputed (no history): it is then dropped, never
    invented.
    """

    name: ClassVar[str]
    window: ClassVar[int]  # how many past states the forecaster looks at

    @abstractmethod
    def forecast(self, history: Sequence[TensorDict]) -> TensorDict | None:
        """The client's parameters for the round it missed."""
