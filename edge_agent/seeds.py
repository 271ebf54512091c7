"""The one seed schedule of every run: each random draw takes its seed from the run's base seed,
a named stream and the indices (round, client, epoch, ...) that make it unique.

The in-process simulation and the services draw from the same streams, which is what lets a
simulation predict the service bit for bit. Stream numbers are part of every benchmark's
results: never renumber one, only add new ones.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """What a seed is for."""

    GLOBAL_INIT = 0  # the initial global state of round 1
    CLIENT_INIT = 1  # a client's model before its first round (client index)
    LOCAL_TRAINING = 2  # one client's local epochs in one round (round, client index)
    LOCAL_ONLY_EPOCH = 3  # the local-only baseline (client index, epoch)
    CENTRALIZED_ORDER = 4  # the centralized baseline's batch order (epoch)
    CENTRALIZED_DROPOUT = 5  # the centralized baseline's dropout masks (epoch)
    PROMPT_NOISE = 6  # privacy noise on uploaded prompts (round, client index)
    GRAPH_INIT = 7  # the coordinator's FedPoD graph parameters
    PARTICIPATION = 8  # who takes part in a round (sampling, dropout scenarios)
    MASKS = 9  # masked-reconstruction masks (evaluation: batch start)
    PERSONAL_PHASE = 10  # the personal part fitted to a newly installed global state (round, client index)
    SERVER_NOISE = 11  # the coordinator's Gaussian noise on the aggregate (DP-FedAvg: round)
    CORESET = 12  # a client's core-set: start and matching batches (round, client index)
    CORESET_NOISE = 13  # Fourier-magnitude noise on an uploaded core-set (round, client index)
    CORESET_TUNING = 14  # the server's core-set tuning: batches and masks (round)
    GAME_INIT = 15  # the coordinator's Fed-GAME aggregator parameters
    GAME_GATE_NOISE = 16  # Fed-GAME's noisy top-k gate noise while the server trains it (round)


def derive_seed(*parts: int) -> int:
    """A well-mixed 63-bit seed from several integers (base seed, stream, indices)."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> 1)


def seed_for(base: int, stream: Stream, *indices: int) -> int:
    """The seed of ``stream`` at ``indices`` in a run started with ``base``."""
    return derive_seed(base, int(stream), *indices)
