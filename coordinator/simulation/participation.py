"""Who takes part in each round of a simulation: everyone, a sampled share, the four dropout
scenarios of FedDTW (section 3.3), or what a real fleet did (read from a coordinator's store).

A ``Participation`` holds ``present`` (rounds x clients, 1 = the update arrives on time) and,
for delayed updates, ``late`` (1 = the client trained but its update arrived after the round
closed: it is discarded for aggregation and kept only as twin history) with ``arrival``, the
round during which it arrives (by default the next one); and ``asked`` where the round policy
samples (1 = asked to train; a client not asked is not missing: no twin stands in for it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from coordinator.store import Store
from coordinator.strategies.participation import RoundPolicy
from edge_agent.seeds import Stream, seed_for

Scenario = Literal["fpr", "rcd", "vcpr", "np", "du"]
SCENARIOS: tuple[Scenario, ...] = ("rcd", "vcpr", "np", "du")


@dataclass(frozen=True)
class Participation:
    scenario: str
    present: np.ndarray
    late: np.ndarray
    arrival: np.ndarray | None = None
    asked: np.ndarray | None = None

    @property
    def absence_rate(self) -> float:
        return float(1.0 - self.present.mean())

    @property
    def rounds(self) -> int:
        return self.present.shape[0]

    def training(self, round_number: int) -> list[int]:
        """The clients that train in ``round_number`` (on time or late)."""
        row = round_number - 1
        return [i for i in range(self.present.shape[1]) if self.present[row, i] or self.late[row, i]]

    def asked_in(self, round_number: int) -> list[int]:
        """The clients asked to train in ``round_number`` (every client unless the policy samples)."""
        if self.asked is None:
            return list(range(self.present.shape[1]))
        return [int(i) for i in np.flatnonzero(self.asked[round_number - 1])]

    def arrival_round(self, round_number: int, client: int) -> int:
        """The round during which client ``client``'s late update for ``round_number`` arrives."""
        return round_number + 1 if self.arrival is None else int(self.arrival[round_number - 1, client])


def everyone(rounds: int, clients: int) -> Participation:
    """Full participation: every update on time."""
    return participation("fpr", rounds, clients)


def sampled(rounds: int, clients: int, share: float, seed: int) -> Participation:
    """A share C of the clients per round, drawn without replacement (FedAvg's client sampling)
    from the participation stream of the run's base ``seed``."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share must be in (0, 1], got {share}")
    rng = np.random.default_rng(seed_for(seed, Stream.PARTICIPATION))
    per_round = max(1, math.ceil(share * clients))
    present = np.zeros((rounds, clients), dtype=np.int8)
    for row in present:
        row[rng.choice(clients, per_round, replace=False)] = 1
    return Participation("sampled", present, np.zeros_like(present))


def policy_driven(policy: RoundPolicy, rounds: int, clients: Sequence[str]) -> Participation:
    """The round policy's participants, drawn as the coordinator draws them for a fleet whose
    ``clients`` are all online and eligible, every one of them reporting on time."""
    asked = np.zeros((rounds, len(clients)), dtype=np.int8)
    for number in range(1, rounds + 1):
        chosen = set(policy.participants(number, clients))
        asked[number - 1] = [c in chosen for c in clients]
    return Participation("policy", asked.copy(), np.zeros_like(asked), asked=asked)


def recorded(store: Store, clients: Sequence[str]) -> Participation:
    """What a real fleet did, read from its coordinator's store: whose update was on time in each
    closed round, each late update with the round during which it arrived (the first round
    closed after it was received) and, where the round policy sampled, who was asked. Replaying
    it in a simulation reproduces the fleet's rounds."""
    rows = [row for row in store.rounds() if row.closed_at is not None]
    closed = [(row.round, row.closed_at) for row in rows]
    shape = (len(closed), len(clients))
    present, late, arrival = np.zeros(shape, np.int8), np.zeros(shape, np.int8), np.zeros(shape, np.int64)
    asked = np.array([[c in row.metrics.get("asked", ()) for c in clients] for row in rows], np.int8).reshape(shape)
    sampled_rounds = any(row.metrics.get("sampled") for row in rows)
    for number, client, was_late, received in store.arrivals():
        if number > len(closed) or client not in clients:
            continue
        cell = (number - 1, clients.index(client))
        if not was_late:
            present[cell] = 1
            continue
        late[cell] = 1
        arrival[cell] = next((r for r, at in closed if at > received), len(closed) + 1)
    return Participation("recorded", present, late, arrival, asked if sampled_rounds else None)


def participation(
    scenario: Scenario, rounds: int, clients: int, absence: float = 0.5, seed: int = 0,
    clusters: int = 3, stretch: int = 3,
) -> Participation:
    """Build the matrix for ``scenario``; ``absence`` is the target share of missing updates and
    ``seed`` the run's base seed (draws come from its participation stream)."""
    if not 0.0 <= absence < 1.0:
        raise ValueError(f"absence must be in [0, 1), got {absence}")
    rng = np.random.default_rng(seed_for(seed, Stream.PARTICIPATION))
    late = np.zeros((rounds, clients), dtype=np.int8)
    if scenario == "fpr":
        present = np.ones((rounds, clients), dtype=np.int8)
    elif scenario == "rcd":
        present = _uniform(rng, rounds, clients, absence)
    elif scenario == "vcpr":
        present = _varying(rng, rounds, clients, absence)
    elif scenario == "np":
        present = _partitions(rng, rounds, clients, absence, clusters, stretch)
    elif scenario == "du":
        late = _delays(rng, rounds, clients, absence)
        present = (1 - late).astype(np.int8)
    else:
        raise ValueError(f"scenario: unknown {scenario!r}; choose fpr or one of {SCENARIOS}")
    return Participation(scenario, present, late)


def _uniform(rng: np.random.Generator, rounds: int, clients: int, absence: float) -> np.ndarray:
    """RCD: exactly round(absence * cells) absences, uniformly at random."""
    present = np.ones(rounds * clients, dtype=np.int8)
    present[rng.choice(present.size, round(absence * present.size), replace=False)] = 0
    return present.reshape(rounds, clients)


def _varying(rng: np.random.Generator, rounds: int, clients: int, absence: float) -> np.ndarray:
    """VCPR: participation probability p(t) = 1 - absence * (1 + 0.8 sin(2 pi t / period)),
    a random phase and a period of half the run, so whole stretches of rounds are thin."""
    t = np.arange(rounds)
    period = max(rounds / 2, 2)
    swing = np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi))
    p = np.clip(1 - absence * (1 + 0.8 * swing), 0.0, 1.0)
    return (rng.random((rounds, clients)) < p[:, None]).astype(np.int8)


def _partitions(
    rng: np.random.Generator, rounds: int, clients: int, absence: float, clusters: int, stretch: int
) -> np.ndarray:
    """NP: clients fall into ``clusters`` fixed groups; each group is cut off as a whole for
    stretches of ``stretch`` rounds, each stretch independently with probability ``absence``."""
    group = rng.permutation(clients) % max(1, min(clusters, clients))
    blocks = math.ceil(rounds / stretch)
    cut = rng.random((blocks, group.max() + 1)) < absence
    rows = np.repeat(cut, stretch, axis=0)[:rounds]
    return (~rows[:, group]).astype(np.int8)


def _delays(rng: np.random.Generator, rounds: int, clients: int, absence: float) -> np.ndarray:
    """DU: client i's update is late whenever (t + phase_i) mod k_i < ceil(absence * k_i), with a
    period k_i drawn from 2..9 (the paper's t mod k rule); late updates are discarded."""
    periods = rng.integers(2, 10, size=clients)
    phases = rng.integers(0, 9, size=clients)
    t = np.arange(rounds)[:, None]
    return (((t + phases) % periods) < np.ceil(absence * periods)).astype(np.int8)
