"""How a client of the coordinator (an edge agent, a site aggregator) answers the coordinator's
refusals: one rule for both.

A refusal that concerns the client as a whole is either *transient* (``unknown_client``: the
coordinator does not know us yet, or lost us; introducing ourselves again fixes it) or *terminal*
(``not_allowed``, ``bad_signature``, ...: nothing changes until an operator acts; the client
stops training meanwhile); a refusal of one message (a duplicate, a late or malformed update) is
neither and changes nothing here. Either way the next introduction waits an exponentially
growing, jittered delay (``edge_agent.backoff`` with equal jitter: at least half of
``base_s * 2**n``, so the hellos a minute have a hard bound), so a refused client cannot flood
the broker; after ``max_terminal`` terminal refusals in a row, spread over at least
``give_up_after_s`` (an operator fixing the coordinator's config meanwhile loses no gateway),
the client gives up (``Refused``) and its process exits non-zero for systemd and the operator
to see. An accepted message resets both.
"""

from __future__ import annotations

import logging
import time

from edge_agent.backoff import Backoff

log = logging.getLogger("edgefl.refusals")
RETRY = frozenset({"unknown_client"})
TERMINAL = frozenset({"not_allowed", "bad_signature", "wrong_fleet", "wrong_sender", "bad_version", "too_large"})
RESEND_MAY_HELP = RETRY | TERMINAL | frozenset({"future_round", "internal"})
"""Refusals of an update after which the same bytes may still be taken: once we are registered,
once an operator has acted, once the round starts, once the coordinator has recovered. Any other
refusal (a duplicate, a round forgotten or never announced, a replay, a client not asked, a
malformed body) is final for that update: sent again, it would only be refused again."""
REFUSED_EXIT_CODE = 3  # what `edgefl agent run` / `aggregator serve` exit with when the coordinator keeps refusing


class Refused(RuntimeError):
    """The coordinator refused this client for a reason it cannot fix by itself, too often."""


class RefusalBackoff:
    """The backoff policy after refusals: when to introduce ourselves (again) to the coordinator,
    and when to give up."""

    def __init__(self, who: str, *, base_s: float = 2.0, cap_s: float = 300.0, max_terminal: int = 3,
                 give_up_after_s: float = 30.0, seed: int | None = None):
        self.who, self.max_terminal, self.give_up_after_s = who, max_terminal, give_up_after_s
        self.timer = Backoff(base_s, cap_s, jitter=True, seed=seed)  # its failures: introductions refused in a row
        self.terminal: list[str] = []  # the terminal refusals in a row, their reasons
        self._first_terminal = 0.0  # when the first of them came (monotonic)

    def accepted(self) -> None:
        """The coordinator took a message of ours: start over (an introduction already scheduled stays)."""
        self.timer.reset(keep_scheduled=True)
        self.terminal = []

    def refused(self, code: str, about: str, reason: str) -> None:
        """A refusal: schedule the next introduction after a backoff; raise ``Refused`` after
        ``max_terminal`` terminal refusals in a row."""
        if code not in RETRY | TERMINAL:
            return
        if code in TERMINAL:
            self._terminal(code, about, reason)
        if self.timer.due_at is not None:
            return  # the answers to one introduction (hello, re-sent update) share its backoff
        delay = self.timer.failed()
        log.info("%s: introducing ourselves again in %.1f s (refusal %d in a row: %s)", self.who, delay,
                 self.timer.failures, code)

    def _terminal(self, code: str, about: str, reason: str) -> None:
        """Count a terminal refusal; raise ``Refused`` once there were enough over long enough."""
        if not self.terminal:
            self._first_terminal = time.monotonic()
        self.terminal.append(f"{about} refused ({code}): {reason}")
        log.error("%s: the coordinator refused our %s (%s): %s [terminal refusal %d; giving up after %d over "
                  "%.0f s]", self.who, about, code, reason, len(self.terminal), self.max_terminal,
                  self.give_up_after_s)
        waited = time.monotonic() - self._first_terminal
        if len(self.terminal) >= self.max_terminal and waited >= self.give_up_after_s:
            raise Refused(f"{self.who}: the coordinator refused us {len(self.terminal)} times for reasons only "
                          f"an operator can fix; last: {self.terminal[-1]}")

    @property
    def shut_out(self) -> bool:
        """Whether the coordinator's last word was a terminal refusal (no point in training)."""
        return bool(self.terminal)

    def due(self) -> bool:
        """Whether a scheduled introduction is due now (it is then taken off the schedule)."""
        return self.timer.take_due()


def settled(accepted: bool, code: str) -> bool:
    """Whether an answer to an update ends its resending: it was taken, or refused for good."""
    return accepted or code not in RESEND_MAY_HELP
