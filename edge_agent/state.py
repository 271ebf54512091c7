"""The files an agent keeps in its ``state_dir``, each replaced atomically: progress (the campaign
it takes part in and the last round trained), the learner's personal state, the last global
state, and an update not yet acknowledged (re-sent after every reconnect until the coordinator
answers). All of it belongs to one campaign; joining another starts over. torch-free: the
training agent writes the global states it accepts as numpy arrays, its child processes read
them as torch tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.storage import write_bytes_atomically, write_tensors_atomically
from edge_agent.tensors import Framework, TensorDict, read_tensors

if TYPE_CHECKING:
    from edge_agent.learners import Learner


class AgentState:
    """One agent's state folder."""

    def __init__(self, folder: Path):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.pending = self.dir / "pending_update.edfl"
        self._progress, self._personal, self._global = (
            self.dir / "agent.json", self.dir / "personal.safetensors", self.dir / "global.safetensors")
        progress = json.loads(self._progress.read_text()) if self._progress.is_file() else {}
        self.campaign: str | None = progress.get("campaign")

    def trained_round(self) -> int:
        return int(json.loads(self._progress.read_text())["trained_round"]) if self._progress.is_file() else 0

    def has_trained_model(self) -> bool:
        """Whether local training has saved a personal state (a model of this gateway's own) yet."""
        return self._personal.is_file()

    def save_round(self, learner: Learner, round_index: int, payload: bytes) -> None:
        """After training: the personal state, the update to (re)send, then the round as done."""
        write_tensors_atomically(self._personal, learner.personal_state())
        write_bytes_atomically(self.pending, payload)
        self.mark_trained(round_index)

    def join(self, campaign: str) -> None:
        """Belong to ``campaign`` from now on, forgetting everything of the one before (models,
        progress, an update not yet answered)."""
        for path in (self.pending, self._personal, self._global):
            path.unlink(missing_ok=True)
        self.campaign = campaign
        self.mark_trained(0)

    def mark_trained(self, round_index: int) -> None:
        """The round is done (trained and sent, or given up): it is not trained again after a restart."""
        progress = {"trained_round": round_index, "campaign": self.campaign}
        write_bytes_atomically(self._progress, json.dumps(progress).encode())

    def save_personal(self, learner: Learner) -> None:
        write_tensors_atomically(self._personal, learner.personal_state())

    def save_global(self, state: TensorDict) -> None:
        write_tensors_atomically(self._global, state)

    def fleet_state(self, framework: Framework = "pt") -> TensorDict | None:
        """The last global state accepted, None before the first."""
        return read_tensors(self._global, framework) if self._global.is_file() else None

    def restore(self, learner: Learner) -> Learner:
        """The learner with its saved personal state and the last global state installed."""
        if self._personal.is_file():
            learner.restore(read_tensors(self._personal))
        if self._global.is_file():
            learner.load_global(read_tensors(self._global))
        return learner
