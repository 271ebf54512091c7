"""The engine-only round driver that prompt mode's and pretraining's simulations still use: every
client's learner in one process, rounds closed by the round engine directly, participation
decided by a ``Participation``. Head mode runs through the service's own loop instead
(``coordinator.simulation.grid``); these two are to follow (issue 47), and this driver goes then."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence

from coordinator.engine import RoundEngine
from coordinator.simulation.grid import SIMULATED_FLEET, SimulatedRound
from coordinator.simulation.participation import Participation
from coordinator.strategies import ClientInfo, ClientUpdate
from edge_agent.learners import Learner
from edge_agent.protocol import (
    MAX_SAMPLES, PLACEHOLDER_DIGEST, PersonalHeader, RoundHeader, UpdateHeader, envelope_size,
)
from edge_agent.tensors import TensorDict




def wire_bytes(update: ClientUpdate, state: TensorDict, personal: TensorDict | None) -> int:
    """The MQTT payload bytes one client exchanges in a round, as the service would encode them:
    its update up; the next round's global state and its personal message, if any, down."""
    metrics = {k: v for k, v in update.metrics.items() if math.isfinite(v)}  # the agent leaves out the others
    samples = min(max(update.n_samples, 1), MAX_SAMPLES)  # a tampered count is sized as the largest valid one
    name = SIMULATED_FLEET  # fleet and sender in the envelopes sized
    up = envelope_size(UpdateHeader(fleet=name, sender=name, round=1, n_samples=samples, metrics=metrics,
                                    global_sha256=PLACEHOLDER_DIGEST), update.params)
    down = envelope_size(RoundHeader(fleet=name, sender=name, round=1, deadline_unix=1.0, model_signature="0" * 16),
                         state)
    extra = envelope_size(PersonalHeader(fleet=name, sender=name, round=1), personal) if personal else 0
    return up + down + extra


def run_rounds(learners: Sequence[Learner], roster: Sequence[ClientInfo], engine: RoundEngine, initial: TensorDict,
               participation: Participation, on_round: Callable[[SimulatedRound], None]) -> TensorDict:
    """Run ``participation.rounds`` rounds: each round's clients load the global state and train
    (as an agent does on a round announcement), the on-time updates close the round, late ones
    reach the engine in the round they arrive (twin history, and a stand-in at that round's
    close: ``RoundEngine``); then every learner installs the new global state and its personal
    message, if any. Returns the last global state."""
    state, pending = initial, defaultdict(list)
    for number in range(1, participation.rounds + 1):
        started = time.perf_counter()
        on_time, late, sent = [], [], []
        for i in participation.training(number):
            learners[i].load_global(state)
            loss = learners[i].train(number)
            update = ClientUpdate(roster[i].client_id, learners[i].wire_state(number), learners[i].n_samples,
                                  {"loss": loss})
            sent.append(update)
            if participation.present[number - 1, i]:
                on_time.append(update)
            else:
                late.append(update.client_id)
                pending[participation.arrival_round(number, i)].append((number, update, state))
        for trained_in, update, trained_from in pending.pop(number, []):
            engine.observe_late(update, trained_in, trained_from)
        result = engine.close(number, state, on_time, [roster[i] for i in participation.asked_in(number)])
        state = result.global_state
        for learner, client in zip(learners, roster):
            learner.load_global(state)
            if client.client_id in result.personal:
                learner.install_personal(result.personal[client.client_id])
        sizes = {u.client_id: wire_bytes(u, state, result.personal.get(u.client_id)) for u in sent}
        on_round(SimulatedRound(result, tuple(late), time.perf_counter() - started, sizes))
    return state
