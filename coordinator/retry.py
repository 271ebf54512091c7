"""When to try the store again after it failed (a full disk, a database that went away): a timer
with exponential backoff and a cap, so the coordinator re-drives what it holds once space returns
without an operator, and does not hammer a store that stays down."""

from __future__ import annotations

import logging
import time

log = logging.getLogger("edgefl.coordinator")
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 30.0


class StorageRetry:
    """Failures in a row since the store last took a write, and when the next try is due."""

    def __init__(self, first_s: float = FIRST_PAUSE_S, cap_s: float = MAX_PAUSE_S):
        self.first_s, self.cap_s = first_s, cap_s
        self.failures = 0
        self._due_at = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._due_at

    def wait(self, at_most_s: float) -> None:
        """Sleep until the next try is due, at most ``at_most_s`` (a service loop's turn)."""
        time.sleep(max(0.0, min(at_most_s, self._due_at - time.monotonic())))

    def failed(self, what: str, err: Exception) -> None:
        """``what`` could not be stored: the next try after a pause that doubles up to the cap."""
        pause = min(self.cap_s, self.first_s * 2**self.failures)
        self.failures += 1
        self._due_at = time.monotonic() + pause
        log.error("could not store %s (failure %d in a row; trying again in %.1f s): %s", what, self.failures,
                  pause, err)

    def succeeded(self) -> None:
        if self.failures:
            log.info("the store takes writes again after %d failed tries", self.failures)
        self.failures, self._due_at = 0, 0.0
