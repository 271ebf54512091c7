"""Each client's recent observed shared parameters: a bounded window per client.

In memory for simulations; on disk (one safetensors file per observation, older ones deleted)
for the service, so memory stays bounded however many clients there are.
"""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from coordinator.twins.base import TensorDict
from edge_agent.storage import write_tensors_atomically


class TwinHistory:
    """The last ``window`` observed states of every client, oldest first."""

    def __init__(self, window: int, folder: Path | None = None):
        self.window = max(window, 1)
        self.folder = Path(folder) if folder else None
        self._memory: dict[str, list[tuple[int, TensorDict]]] = {}

    def observe(self, client: str, round_number: int, state: TensorDict) -> None:
        """Record the state a client reported for ``round_number`` (on time or late)."""
        if self.folder is None:
            kept = self._memory.setdefault(client, [])
            kept.append((round_number, {k: v.detach().clone() for k, v in state.items()}))
            kept.sort(key=lambda entry: entry[0])
            del kept[: -self.window]
            return
        write_tensors_atomically(self.folder / client / f"round_{round_number:05d}.safetensors", state)
        for old in self._files(client)[: -self.window]:
            old.unlink()

    def history(self, client: str) -> list[TensorDict]:
        if self.folder is None:
            return [state for _, state in self._memory.get(client, ())]
        return [load_file(str(path)) for path in self._files(client)]

    def last_round(self, client: str) -> int | None:
        """The newest round the client reported for, or None before its first report."""
        if self.folder is None:
            kept = self._memory.get(client)
            return kept[-1][0] if kept else None
        files = self._files(client)
        return int(files[-1].stem.removeprefix("round_")) if files else None

    def _files(self, client: str) -> list[Path]:
        folder = self.folder / client
        return sorted(folder.glob("round_*.safetensors")) if folder.is_dir() else []
