"""Each client's recent observed shared parameters: a bounded window per client.

In memory for simulations; in the service's store (one row of its tensor table per
observation, older ones deleted), so memory stays bounded however many clients there are and a
standby coordinator sees the same history.
"""

from __future__ import annotations

from typing import Protocol

from coordinator.twins.base import TensorDict


class TensorStorage(Protocol):
    """Named tensor sets (``coordinator.store_backends.TensorTable``: rows of the store's database)."""

    def write(self, name: str, tensors: TensorDict) -> None: ...

    def read(self, name: str) -> TensorDict: ...

    def names(self, folder: str) -> list[str]: ...

    def delete(self, name: str) -> None: ...


class TwinHistory:
    """The last ``window`` observed states of every client, oldest first."""

    def __init__(self, window: int, storage: TensorStorage | None = None):
        """``storage``: where the service keeps the history (below ``twins/``); None: in memory."""
        self.window = max(window, 1)
        self.storage = storage
        self._memory: dict[str, list[tuple[int, TensorDict]]] = {}

    def observe(self, client: str, round_number: int, state: TensorDict) -> None:
        """Record the state a client reported for ``round_number`` (on time or late)."""
        if self.storage is None:
            kept = self._memory.setdefault(client, [])
            kept.append((round_number, {k: v.detach().clone() for k, v in state.items()}))
            kept.sort(key=lambda entry: entry[0])
            del kept[: -self.window]
            return
        self.storage.write(f"twins/{client}/round_{round_number:05d}.safetensors", state)
        for old in self._names(client)[: -self.window]:
            self.storage.delete(old)

    def history(self, client: str) -> list[TensorDict]:
        if self.storage is None:
            return [state for _, state in self._memory.get(client, ())]
        return [self.storage.read(name) for name in self._names(client)]

    def last_round(self, client: str) -> int | None:
        """The newest round the client reported for, or None before its first report."""
        if self.storage is None:
            kept = self._memory.get(client)
            return kept[-1][0] if kept else None
        names = self._names(client)
        return int(names[-1].rsplit("round_", 1)[1].removesuffix(".safetensors")) if names else None

    def _names(self, client: str) -> list[str]:
        """The client's stored observations, oldest round first (zero-padded names sort by round)."""
        return self.storage.names(f"twins/{client}")
