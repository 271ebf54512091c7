"""Seeded client-participation matrices for the four dropout scenarios of FedDTW (section 3.3).

A ``Participation`` holds ``present`` (rounds x clients, 1 = the update arrives on time) and,
for delayed updates, ``late`` (1 = the client trained but its update arrived after the round
closed: it is discarded for aggregation and kept only as twin history).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

Scenario = Literal["fpr", "rcd", "vcpr", "np", "du"]
SCENARIOS: tuple[Scenario, ...] = ("rcd", "vcpr", "np", "du")


@dataclass(frozen=True)
class Participation:
    scenario: str
    present: np.ndarray
    late: np.ndarray

    @property
    def absence_rate(self) -> float:
        return float(1.0 - self.present.mean())


def participation(
    scenario: Scenario, rounds: int, clients: int, absence: float = 0.5, seed: int = 0,
    clusters: int = 3, stretch: int = 3,
) -> Participation:
    """Build the matrix for ``scenario``; ``absence`` is the target share of missing updates."""
    if not 0.0 <= absence < 1.0:
        raise ValueError(f"absence must be in [0, 1), got {absence}")
    rng = np.random.default_rng(seed)
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
