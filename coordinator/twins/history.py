"""Each client's recent observed shared parameters: a bounded window per client.

In memory for simulations; on disk (one safetensors file per observation, older ones deleted)
for the service, so memory stays bounded however many clients there are.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from safetensors.torch import load_file

from coordinator.twins.base import TensorDict
from edge_agent.storage import write_tensors_atomically


class TwinHistory:
    """The last ``window`` observed states of every client, oldest first."""

    def __init__(self, window: int, folder: Path | None = None):
        self.window = max(window, 1)
        self.folder = Path(folder) if folder else None
        self._memory: dict[str, deque[TensorDict]] = {}

    def observe(self, client: str, round_number: int, state: TensorDict) -> None:
        """Record the state a client reported for ``round_number`` (on time or late)."""
        if self.folder is None:
            self._memory.setdefault(client, deque(maxlen=self.window)).append(
                {k: v.detach().clone() for k, v in state.items()}
            )
            return
        write_tensors_atomically(self.folder / client / f"round_{round_number:05d}.safetensors", state)
        for old in self._files(client)[: -self.window]:
            old.unlink()

    def history(self, client: str) -> list[TensorDict]:
        if self.folder is None:
            return list(self._memory.get(client, ()))
        return [load_file(str(path)) for path in self._files(client)]

    def _files(self, client: str) -> list[Path]:
        folder = self.folder / client
        return sorted(folder.glob("round_*.safetensors")) if folder.is_dir() else []
