"""The round engine: how every strategy closes a round, in the in-process simulation and in the
coordinator service alike (FedDTW Algorithm 5 around any strategy).

Close of round r: the registered clients without an on-time update are imputed by their digital
twins (or dropped), every update is screened (weight bounded by the hello's sample count, non-finite
updates and norm outliers rejected, large deltas clipped: ``strategies.bounds``), each client's
trust moves with its on-time update's direction and cuts the weight of its update or forecast
(``strategies.trust``: influence bounded over time), the strategy
combines the on-time and imputed updates that passed, and those on-time updates join the twins'
history. Late updates join that history when they arrive, but only from a client that is
sometimes on time: one with an accepted on-time update at most ``twin_max_age`` rounds before
the late update's round (any earlier one when ``twin_max_age`` is unset), so a device that never
reports on time cannot steer the aggregate through its twin. Such a kept late update also stands
in for its client at the next close, if the client has no on-time update there (``late_updates
= "next_round"``, ``twins.late``). A close that needs ``need`` on-time updates and has fewer
after the screen raises ``TooFewScreened`` before anything changes. Updates are ordered by
client id, so the same updates give bit-identical results wherever the round closes.

With the buffered round policy (FedBuff: Nguyen et al., "Federated Learning with Buffered
Asynchronous Aggregation", AISTATS 2022, Algorithm 1) every late update is held, whether or not
its client is sometimes on time (twin history still only from those), and enters the next close
where its client has no on-time update and it is at most ``max_staleness`` rounds old: its change
from the global state it was trained from (the round its header names, whose announced state its
``global_sha256`` binds) is scaled by s(t) = (1 + t)^-a, t = rounds between that round and the
close, and applied to the close's global state with its own sample count. The strategy combines
the buffer as ever (FedAvg: current + sum_i p_i s(t_i) delta_i, p_i the sample shares, the
paper's 1/K for equal counts) and the global state moves by ``server_lr`` times that change.
On-time updates have t = 0 and pass unchanged, so with nothing late and ``server_lr = 1`` a
buffered close is bit-identical to a synchronous one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.strategies import ClientInfo, ClientUpdate, Strategy
from coordinator.strategy_settings import BufferSettings, RobustSettings
from coordinator.strategies.bounds import MIN_DIRECTION_UPDATES, screen
from coordinator.strategies.trust import LOW_TRUST, progress_along_others, multiplier, scored, weighed
from coordinator.twin_settings import TwinSettings
from coordinator.twins import TwinHistory, impute_missing, make_forecaster
from coordinator.twins.history import TensorStorage
from coordinator.twins.late import LateUpdates
from edge_agent.tensors import TensorDict


@dataclass(frozen=True)
class ClosedRound:
    """A closed round: the next global state, per-client messages, who took part and how.

    ``on_time`` clients sent updates before the close that entered aggregation; ``imputed`` ones
    entered as their twins' forecasts; ``dropped`` ones were missing with no (recent enough)
    history; ``rejected`` maps the clients whose update or forecast failed screening to a code
    (``not_finite``, ``norm_outlier``, ``against_median``, ``unregistered``, ``low_trust``); ``clipped``
    ones entered with their delta scaled back or their weight cut; ``trust`` is every scored client's
    trust after the round (what a resuming engine starts from); ``stale`` ones entered as their late update of an earlier
    round (``twins.late``). ``loss`` is the sample-weighted training loss the accepted on-time clients
    reported (NaN without any); ``weight`` is the sample count the aggregate stands for (the
    bounded counts of the on-time and imputed updates it combined: what a site reports upward)."""

    round: int
    global_state: TensorDict
    personal: dict[str, TensorDict]
    on_time: tuple[str, ...]
    imputed: tuple[str, ...]
    dropped: tuple[str, ...]
    loss: float
    twin: str
    metrics: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    clipped: tuple[str, ...] = ()
    weight: int = 0
    stale: tuple[str, ...] = ()
    trust: dict[str, float] = field(default_factory=dict)


class TooFewScreened(Exception):
    """A close whose on-time updates that passed the screen are fewer than it needs: nothing was
    aggregated and nothing changed; ``rejected`` says why the others were left out."""

    def __init__(self, round_number: int, passed: int, need: int, rejected: dict[str, str]):
        super().__init__(f"round {round_number}: {passed} on-time updates passed the screen, {need} needed "
                         f"(left out: {rejected})")
        self.passed, self.need, self.rejected = passed, need, rejected


class RoundEngine:
    """Runs a strategy with digital twins of the clients."""

    def __init__(self, strategy: Strategy, twins: TwinSettings, history: TensorStorage | None = None, *,
                 robust: RobustSettings, on_time: dict[str, int] | None = None, state_keys: Iterable[str] = (),
                 trust: Mapping[str, float] | None = None, buffer: BufferSettings | None = None):
        """``history``: the store's tensor storage, to keep the twins' history there (the service),
        else it stays in memory; ``robust``: how updates are screened before the strategy sees them; ``on_time``: each
        client's newest closed round with an accepted on-time update (a service resuming);
        ``state_keys``: the global state's tensor names, known before a close (a service resuming
        takes late updates before its first close); else learnt from the first close; ``trust``:
        each client's trust as the last close left it (a service resuming); ``buffer``: the
        buffered round policy's settings (None: synchronous rounds)."""
        self.strategy, self.max_age, self.robust, self.buffer = strategy, twins.twin_max_age, robust, buffer
        self.late = LateUpdates() if twins.late_updates == "next_round" or buffer is not None else None
        self.forecaster = make_forecaster(twins.twin)
        self.history = TwinHistory(self.forecaster.window, history)
        self.on_time = dict(on_time or {})
        self.state_keys: frozenset[str] = frozenset(state_keys)
        self.trust: dict[str, float] = dict(trust or {})  # replaced, never changed in place: callers snapshot it

    def observe_late(self, update: ClientUpdate, round_number: int, trained_from: TensorDict) -> bool:
        """An update for ``round_number`` that arrived after the round closed, trained from the
        global state ``trained_from``: twin history, and held for the next close, only from a
        client recently on time, held from any client under the buffered policy (see the module
        docstring). Returns whether it was kept."""
        last = self.on_time.get(update.client_id)
        recent = last is not None and (self.max_age is None or last >= round_number - self.max_age)
        if recent:
            self._observe(update.client_id, round_number, update.params)
        if self.late is None or not (recent or self.buffer is not None):
            return recent
        self.late.hold(update, round_number, trained_from)
        return True

    def held(self, round_number: int) -> list[str]:
        """The clients whose late updates the buffered close of ``round_number`` would take where
        they have no on-time update (none under the synchronous policy)."""
        if self.buffer is None or self.late is None:
            return []
        return self.late.usable(round_number, self.buffer.max_staleness)

    def _observe(self, client_id: str, round_number: int, params: TensorDict) -> None:
        """A client's model into its twin's history, unless the twin reads none (``drop``: no
        write per client and round)."""
        if self.forecaster.window > 0:
            self.history.observe(client_id, round_number, _model_part(params, self.state_keys))

    def close(self, round_number: int, current: TensorDict, on_time: Sequence[ClientUpdate],
              roster: Sequence[ClientInfo], need: int = 0) -> ClosedRound:
        """Close ``round_number`` whose global state was ``current``; ``roster`` is every
        registered client; ``need``: the on-time updates that must pass the screen (else
        ``TooFewScreened``). With no update left after screening the global state stays as it was."""
        on_time = sorted(on_time, key=lambda u: u.client_id)
        self.state_keys = frozenset(current)
        reported = {u.client_id for u in on_time}
        clients = {c.client_id: c for c in roster}
        missing = {c.client_id for c in roster if c.client_id not in reported}
        stale = self._stale(round_number, current, missing)
        missing -= {u.client_id for u in stale}
        imputation = impute_missing(sorted((c, clients[c].n_samples) for c in missing), self.history, self.forecaster,
                                    round_number, self.max_age)
        screened = screen(current, [*on_time, *stale, *imputation.updates], clients, self.robust)
        trust = self._scored(current, screened.accepted, reported)
        entering, low, cut = weighed(screened.accepted, self._shares(trust))
        rejected = {**screened.rejected, **dict.fromkeys(low, LOW_TRUST)}
        accepted = [u for u in entering if u.client_id in reported]
        if len(accepted) < need:
            raise TooFewScreened(round_number, len(accepted), need, rejected)
        imputed = [u for u in entering if u.client_id not in reported]
        state, personal, metrics = current, {}, {}
        if entering:
            aggregate = self.strategy.aggregate(round_number, current, accepted, imputed, clients)
            state, personal, metrics = aggregate.global_state, aggregate.personal, aggregate.metrics
            state = self._stepped(current, state)
        for update in accepted:
            self._observe(update.client_id, round_number, update.params)
            self.on_time[update.client_id] = round_number
        if self.late is not None:
            self.late = LateUpdates()  # a new object: a caller that rolls back keeps the old one
        self.trust = trust
        stood_in = {u.client_id for u in stale}
        clipped = (*screened.clipped, *(c for c in cut if c not in screened.clipped))
        return ClosedRound(round_number, state, personal, tuple(u.client_id for u in accepted),
                           tuple(u.client_id for u in imputed if u.client_id not in stood_in),
                           tuple(imputation.dropped), _mean_loss(accepted), self.forecaster.name, metrics,
                           rejected, clipped, sum(u.n_samples for u in entering),
                           tuple(u.client_id for u in imputed if u.client_id in stood_in), dict(trust))

    def _stale(self, round_number: int, current: TensorDict, missing: set[str]) -> list[ClientUpdate]:
        """The held late updates that enter this close for ``missing`` clients: stand-ins
        (synchronous) or the buffer's staleness-scaled changes (buffered)."""
        if self.late is None:
            return []
        if self.buffer is None:
            return self.late.stand_ins(round_number, current, missing)
        usable = [c for c in self.late.usable(round_number, self.buffer.max_staleness) if c in missing]
        return self.late.buffered(round_number, current, usable, self.buffer.staleness_exponent)

    def _stepped(self, current: TensorDict, aggregated: TensorDict) -> TensorDict:
        """The buffered policy's server step: ``current`` moved by ``server_lr`` times the change
        the strategy made (unchanged with synchronous rounds or ``server_lr = 1``)."""
        if self.buffer is None or self.buffer.server_lr == 1.0:
            return aggregated
        lr = self.buffer.server_lr
        return {k: current[k] + lr * (v - current[k]) if v.is_floating_point() and k in current else v
                for k, v in aggregated.items()}

    def _scored(self, current: TensorDict, screened: Sequence[ClientUpdate], reported: set[str]) -> dict[str, float]:
        """The trust after this round's on-time updates, scored against the others that passed the
        screen (unchanged with trust off or under 3 updates)."""
        if self.robust.trust_rate is None or len(screened) < MIN_DIRECTION_UPDATES:
            return self.trust
        progress = progress_along_others(current, screened)
        on_time = {client: score for client, score in progress.items() if client in reported}
        return scored(self.trust, on_time, self.robust.trust_rate, self.robust.trust_prior)

    def _shares(self, trust: Mapping[str, float]) -> dict[str, float]:
        """Each scored client's weight multiplier (none with trust off)."""
        if self.robust.trust_rate is None:
            return {}
        return {client: multiplier(score, self.robust.trust_full, self.robust.trust_zero) for client, score in trust.items()}


def _model_part(params: TensorDict, state: frozenset[str]) -> TensorDict:
    """The tensors of an update that belong to the global state (twins forecast models, not the
    core-sets some strategies' clients send along)."""
    return {k: v for k, v in params.items() if k in state}


def _mean_loss(updates: Sequence[ClientUpdate]) -> float:
    total = sum(u.n_samples for u in updates)
    return sum(u.metrics.get("loss", 0.0) * u.n_samples for u in updates) / total if total else float("nan")
