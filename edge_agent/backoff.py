"""The one backoff timer: the refused agents' and sites' (``edge_agent.refusals``) and the
coordinator's storage retry.

After failures in a row the next try waits a pause that doubles from ``base_s`` up to ``cap_s``,
so what keeps failing does not hammer what refuses it. With ``jitter``, equal jitter (AWS's
"Exponential Backoff And Jitter": a draw from the upper half of the pause), so many clients
refused at once spread out yet have a hard bound."""

from __future__ import annotations

import random
import time


class Backoff:
    """Failures in a row, and when the next try is due (monotonic)."""

    def __init__(self, base_s: float, cap_s: float, *, jitter: bool = False, seed: int | None = None):
        self.base_s, self.cap_s, self.jitter = base_s, cap_s, jitter
        self.failures = 0  # in a row: the exponent
        self.due_at: float | None = None  # None: no try scheduled
        self._random = random.Random(seed)

    def failed(self) -> float:
        """One more failure: schedule the next try after the pause, which is returned."""
        ceiling = min(self.cap_s, self.base_s * 2**self.failures)
        pause = self._random.uniform(ceiling / 2, ceiling) if self.jitter else ceiling
        self.failures += 1
        self.due_at = time.monotonic() + pause
        return pause

    def waiting(self) -> bool:
        """Whether a scheduled try is not due yet."""
        return self.due_at is not None and time.monotonic() < self.due_at

    def take_due(self) -> bool:
        """Whether a scheduled try is due now (it is then taken off the schedule)."""
        if self.due_at is None or self.waiting():
            return False
        self.due_at = None
        return True

    def wait(self, at_most_s: float) -> None:
        """Sleep until the next try is due, at most ``at_most_s`` (a service loop's turn)."""
        if self.due_at is not None:
            time.sleep(max(0.0, min(at_most_s, self.due_at - time.monotonic())))

    def reset(self, *, keep_scheduled: bool = False) -> None:
        """A success: the pause starts again from ``base_s``; ``keep_scheduled`` keeps a try already
        scheduled (one that still has work to do), else the next try is due at once."""
        self.failures = 0
        if not keep_scheduled:
            self.due_at = None
