"""The one interface every learner implements: what a client trains each round and what it
exchanges with the coordinator. The agent daemon and the in-process simulation drive the same
learners, so a simulation predicts the fleet exactly."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from edge_agent.tensors import TensorDict


class Learner(ABC):
    """One client's trainable model, its local data and its training settings.

    Learners keep no files: the agent persists ``personal_state`` and restores it with
    ``restore``; the simulation keeps learners in memory.
    """

    kind: ClassVar[str]
    n_features: int
    n_samples: int
    signature: str

    @abstractmethod
    def load_global(self, state: TensorDict) -> None:
        """Install the global state a round announced (checked against the wire layout)."""

    @abstractmethod
    def train(self, round_index: int) -> float:
        """Train locally for round ``round_index``; returns the mean training loss."""

    @abstractmethod
    def wire_state(self, round_index: int) -> TensorDict:
        """What this client uploads for ``round_index`` (detached copies)."""

    @abstractmethod
    def personal_state(self) -> TensorDict:
        """Everything that never leaves the device and must survive a restart."""

    @abstractmethod
    def restore(self, state: TensorDict) -> None:
        """Reinstall a ``personal_state`` saved earlier."""

    def global_part(self, wire: TensorDict) -> TensorDict:
        """The part of a ``wire_state`` laid out as the round's global state (all of it, unless
        the learner uploads more for the strategy alone, as FeDaL's core-sets)."""
        return wire

    def serving_metrics(self, round_index: int) -> dict[str, float]:
        """Figures about the model this gateway serves once ``round_index`` is announced, sent
        with its update (none by default)."""
        return {}

    def install_personal(self, tensors: TensorDict) -> None:
        """A per-client message of the round's strategy (e.g. FedPoD's personalized prompts)."""
        raise ValueError(f"a {self.kind} learner takes no personal messages")

