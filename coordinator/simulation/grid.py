"""The simulated grid: the coordinator service's own loop (``Coordinator.serve``) over an
in-memory broker and a simulated clock, with every client's learner in this process behind the
wire protocol (hello, update envelopes, round announcements, personal messages), as Flower
drives one strategy loop over a simulated or a deployed grid.

Time passes only where the service waits for a message (its inbox is empty): the simulated
fleet acts first (each gateway reads what the broker delivered, the clients asked to train
train and send), and the clock moves on by the wait's timeout only when nothing came. A round
therefore closes the way the service closes it: when every participant reported, at quorum +
grace, or at its deadline. ``Participation`` is the fleet's arrival schedule: a client present
in round r sends its update at once, one late in round r sends it when round
``arrival_round(r, i)`` is announced, one absent sends nothing.

What differs from the agent daemon: a gateway trains in this process, not in a child (the
learner is the same class; ``tests/test_memory_fleet.py`` shows both give the same rounds).
"""

from __future__ import annotations

import math
import queue
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coordinator.config import CoordinatorConfig
from coordinator.engine import ClosedRound
from coordinator.server import Coordinator, coordinator_subscriptions
from coordinator.simulation.participation import Participation
from coordinator.store import Store
from coordinator.strategies import ClientInfo, ClientUpdate
from coordinator.strategy_settings import StrategySettings
from coordinator.twin_settings import TwinSettings
from edge_agent.learners import FleetTemplate, Learner
from edge_agent.protocol import (
    MAX_SAMPLES, HelloHeader, PersonalHeader, RoundHeader, UpdateHeader, decode, encode,
)
from edge_agent.tensors import TensorDict
from edge_agent.topics import Topics
from edge_agent.transport import MemoryBroker, MemoryTransport

SIMULATED_FLEET = "simulation"
SIMULATED_EPOCH = 1.7e9  # the simulated clock's start, in seconds since the epoch
ROUND_TIMEOUT_S = 1.0  # a round's deadline after its announcement, in simulated seconds
STALL_S = 100 * ROUND_TIMEOUT_S  # simulated seconds without a new announcement: the run is stuck

Tamper = Callable[[ClientUpdate, TensorDict], ClientUpdate]
"""What a compromised client does to its update before sending it, given the global state it
trained from (the robustness benchmark's attacks); honest clients' updates pass unchanged."""


@dataclass(frozen=True)
class SimulatedRound:
    """A closed round as the simulation saw it: the engine's result, the clients that trained
    but were late, the wall time of the round, and the bytes each client that trained exchanged
    with the coordinator (its update up; the next announcement and its personal message down)."""

    result: ClosedRound
    late: tuple[str, ...]
    seconds: float
    bytes_per_client: dict[str, int]


class SimulatedClock:
    """Seconds since the epoch as the simulation has them: they pass only when told to."""

    def __init__(self, start: float = SIMULATED_EPOCH) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class WaitingInbox(queue.Queue):
    """The coordinator's inbox in a simulation: a blocking read of an empty inbox lets the fleet
    act (``idle``, given the read's timeout), then returns what arrived or raises ``queue.Empty``."""

    def __init__(self, idle: Callable[[float], None]) -> None:
        super().__init__()
        self.idle = idle

    def get(self, block: bool = True, timeout: float | None = None):
        if block and self.empty():
            self.idle(timeout or 0.0)
        return super().get(block=False)


@dataclass
class Gateway:
    """One simulated client: its learner, its broker session and what came down to it."""

    info: ClientInfo
    learner: Learner
    session: MemoryTransport
    personal: list[TensorDict] = field(default_factory=list)  # arrived since the last announcement
    received: int = 0  # bytes that came down since the last announcement


def fleet_settings(settings: StrategySettings, **fleet: object) -> dict:
    """The strategy and twin fields of a simulation's ``settings`` (a config that has both) and
    ``fleet``'s model fields, as the coordinator.toml of ``simulated_fleet`` takes them."""
    names = [*StrategySettings.model_fields, *TwinSettings.model_fields]
    return {**{name: getattr(settings, name) for name in names}, **fleet}


def simulated_fleet(settings: dict, rounds: int, seed: int, clients: int, state_dir: Path) -> CoordinatorConfig:
    """The coordinator.toml of a simulated fleet: ``settings`` (the strategy, twin and model
    fields), every client registered before round 1, no quorum needed (a round nobody reports
    in closes at its deadline, the twins standing in: FedDTW's scenarios) and no lingering."""
    return CoordinatorConfig(fleet=SIMULATED_FLEET, state_dir=state_dir, rounds=rounds, seed=seed, min_clients=0,
                             start_clients=clients, round_timeout_s=ROUND_TIMEOUT_S, linger_s=0.0, **settings)


class SimulatedGrid:
    """Runs a coordinator and the simulated gateways of ``learners`` until the campaign ends."""

    def __init__(self, learners: Sequence[Learner], roster: Sequence[ClientInfo], participation: Participation,
                 on_round: Callable[[SimulatedRound], None], tamper: Tamper | None = None):
        self.learners, self.roster, self.participation = learners, roster, participation
        self.on_round, self.tamper = on_round, tamper
        self.clock, self.broker = SimulatedClock(), MemoryBroker()
        self.topics = Topics(SIMULATED_FLEET)
        self.gateways: list[Gateway] = []
        self.closed: ClosedRound | None = None
        self.pending: dict[int, list[tuple[Gateway, bytes]]] = defaultdict(list)  # arrival round -> late updates
        self.sent: dict[str, int] = {}  # bytes each client that trained sent up in the open round
        self.late: list[str] = []
        self.announced, self.final = 0, None  # the last global state, once the end is announced
        self.refused: list[str] = []
        self.moved_at = self.clock()  # when the last round was announced
        self.started = time.perf_counter()

    def run(self, settings: dict, rounds: int, seed: int, template: FleetTemplate | None = None) -> TensorDict:
        """The campaign with the coordinator of ``settings`` (``simulated_fleet``) and the fleet's
        model ``template`` (the one ``settings`` describe if None); the last global state."""
        with tempfile.TemporaryDirectory(prefix="edgefl-simulation-") as folder:
            cfg = simulated_fleet(settings, rounds, seed, len(self.learners), Path(folder))
            store = Store(cfg.state_dir, keep_rounds=cfg.store.keep_rounds, keep_records=cfg.store.keep_records,
                          clock=self.clock)
            self.session = self.broker.session(*coordinator_subscriptions(cfg))
            self.session.inbox = WaitingInbox(self._idle)
            self.coordinator = Coordinator(cfg, self._event, store, transport=self.session, on_close=self._closed,
                                           template=template)
            self.coordinator.serve(stop=self._stalled)
        self._act()  # the end of the campaign, announced as the service exits
        if self.final is None:
            raise RuntimeError(f"the simulated coordinator made no progress for {STALL_S:.0f} simulated seconds "
                               f"after round {self.announced} was announced; refused: {self.refused[:5]}")
        return self.final

    def _stalled(self) -> bool:
        """Whether the rounds stopped moving: every round closes by its deadline, so only a fleet
        whose clients could not register (or a bug) gets here."""
        return self.clock() - self.moved_at > STALL_S

    # the fleet -------------------------------------------------------------------------------

    def _idle(self, timeout: float) -> None:
        """The coordinator waits: the gateways come online first, then read what arrived and
        answer; the clock moves on only when nobody sent anything."""
        if not self.gateways:
            self._connect()
        else:
            self._act()
        if self._queued() == 0:
            self.clock.advance(timeout)

    def _queued(self) -> int:
        return self.session.inbox.qsize()

    def _connect(self) -> None:
        """Every client's session up and its hello sent, in roster order."""
        for learner, info in zip(self.learners, self.roster):
            session = self.broker.session(self.topics.round, self.topics.agent(info.client_id, "task"))
            session.start()
            gateway = Gateway(info, learner, session)
            hello = HelloHeader(fleet=SIMULATED_FLEET, sender=info.client_id, n_features=max(learner.n_features, 1),
                                n_samples=min(max(info.n_samples, 1), MAX_SAMPLES), latitude=info.latitude,
                                longitude=info.longitude,
                                model_signature=self.coordinator.signature, model_settings=self.coordinator.settings)
            session.publish(self.topics.agent(info.client_id, "hello"), encode(hello))
            self.gateways.append(gateway)

    def _act(self) -> None:
        """Each gateway reads its inbox; a new announcement is installed by all, the round that
        closed before it is reported, then the round's clients train and send."""
        announcement = None
        for gateway in self.gateways:
            for message in gateway.session.drain():
                header, tensors = decode(message.payload, self.coordinator.cfg.max_payload_bytes)
                gateway.received += len(message.payload)
                if isinstance(header, PersonalHeader):
                    gateway.personal.append(tensors)
                elif isinstance(header, RoundHeader) and header.round >= self.announced:
                    announcement = header, tensors
        if announcement is not None and (announcement[0].round, announcement[0].finished) != (self.announced, False):
            self._announced(*announcement)

    def _announced(self, header: RoundHeader, state: TensorDict) -> None:
        self.session.published.clear()  # what the in-memory sessions keep of what went through them
        self.session.acked.clear()
        for gateway in self.gateways:
            gateway.session.published.clear()
            gateway.learner.load_global(state)
            for tensors in gateway.personal:
                gateway.learner.install_personal(tensors)
            gateway.personal.clear()
        if self.closed is not None:
            self._report(self.closed)
        self.announced, self.moved_at = header.round, self.clock()
        if header.finished:
            self.final = state
            return
        for gateway, payload in self.pending.pop(header.round, []):
            gateway.session.publish(self.topics.agent(gateway.info.client_id, "update"), payload)
        self._train(header, state)

    def _train(self, header: RoundHeader, state: TensorDict) -> None:
        """The round's clients that the schedule has training, asked by the announcement: each
        trains from ``state`` and sends its update now, or when its late update arrives."""
        number, started = header.round, time.perf_counter()
        self.started, self.sent, self.late = started, {}, []
        for i in self.participation.training(number):
            gateway = self.gateways[i]
            if not header.asks(gateway.info.client_id):
                continue
            payload = self._update(gateway, header, state)
            self.sent[gateway.info.client_id] = len(payload)
            if self.participation.present[number - 1, i]:
                gateway.session.publish(self.topics.agent(gateway.info.client_id, "update"), payload)
            else:
                self.late.append(gateway.info.client_id)
                self.pending[self.participation.arrival_round(number, i)].append((gateway, payload))
        for gateway in self.gateways:
            gateway.received = 0

    def _update(self, gateway: Gateway, header: RoundHeader, state: TensorDict) -> bytes:
        """``gateway``'s update of the announced round, as its agent would send it (``tamper``
        applied first: a compromised client sends what it likes within the protocol's bounds)."""
        learner, number = gateway.learner, header.round
        learner.load_global(state)
        loss = learner.train(number)
        update = ClientUpdate(gateway.info.client_id, learner.wire_state(number), learner.n_samples, {"loss": loss})
        if self.tamper:
            update = self.tamper(update, state)
        metrics = {k: v for k, v in update.metrics.items() if math.isfinite(v)}
        out = UpdateHeader(fleet=SIMULATED_FLEET, sender=update.client_id, round=number,
                           n_samples=min(max(update.n_samples, 1), MAX_SAMPLES), metrics=metrics,
                           campaign=header.campaign, global_sha256=header.body_sha256)
        return encode(out, update.params)

    # the coordinator's side --------------------------------------------------------------------

    def _event(self, kind: str, data: dict) -> None:
        """The coordinator's events: its refusals are kept to say why a run got stuck."""
        if kind == "rejected":
            self.refused.append(f"{data['client']}: {data['code']} ({data['reason']})")

    def _closed(self, result: ClosedRound) -> None:
        self.closed = result

    def _report(self, result: ClosedRound) -> None:
        """The closed round, once every learner installed what it produced."""
        down = {g.info.client_id: g.received for g in self.gateways}
        sizes = {client: up + down[client] for client, up in self.sent.items()}
        self.on_round(SimulatedRound(result, tuple(self.late), time.perf_counter() - self.started, sizes))
        self.closed = None

