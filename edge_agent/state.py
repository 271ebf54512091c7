"""The files an agent keeps in its ``state_dir``, each replaced atomically: progress (the last
round trained), the learner's personal state, the last global state, and an update not yet
acknowledged (re-sent after every reconnect until the coordinator answers)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from edge_agent.learners import Learner
from edge_agent.storage import write_bytes_atomically, write_tensors_atomically
from edge_agent.tensors import TensorDict


class AgentState:
    """One agent's state folder."""

    def __init__(self, folder: Path):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pending = self.dir / "pending_update.edfl"
        self._progress, self._personal, self._global = (
            self.dir / "agent.json", self.dir / "personal.safetensors", self.dir / "global.safetensors")

    def trained_round(self) -> int:
        return int(json.loads(self._progress.read_text())["trained_round"]) if self._progress.is_file() else 0

    def save_round(self, learner: Learner, round_index: int, payload: bytes) -> None:
        """After training: the personal state, the update to (re)send, then the round as done."""
        write_tensors_atomically(self._personal, learner.personal_state())
        write_bytes_atomically(self.pending, payload)
        self.mark_trained(round_index)

    def mark_trained(self, round_index: int) -> None:
        """The round is done (trained and sent, or given up): it is not trained again after a restart."""
        write_bytes_atomically(self._progress, json.dumps({"trained_round": round_index}).encode())

    def save_personal(self, learner: Learner) -> None:
        write_tensors_atomically(self._personal, learner.personal_state())

    def save_global(self, state: TensorDict) -> None:
        write_tensors_atomically(self._global, state)

    def restore(self, learner: Learner) -> Learner:
        """The learner with its saved personal state and the last global state installed."""
        if self._personal.is_file():
            learner.restore(load_file(str(self._personal)))
        if self._global.is_file():
            learner.load_global(load_file(str(self._global)))
        return learner
