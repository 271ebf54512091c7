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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from coordinator.strategies import ClientInfo, ClientUpdate, Strategy
from coordinator.strategy_settings import RobustSettings
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
                 trust: Mapping[str, float] | None = None):
        """``history``: the store's tensor storage, to keep the twins' history there (the service),
        else it stays in memory; ``robust``: how updates are screened before the strategy sees them; ``on_time``: each
        client's newest closed round with an accepted on-time update (a service resuming);
        ``state_keys``: the global state's tensor names, known before a close (a service resuming
        takes late updates before its first close); else learnt from the first close; ``trust``:
        each client's trust as the last close left it (a service resuming)."""
        self.strategy, self.max_age, self.robust = strategy, twins.twin_max_age, robust
        self.late = LateUpdates() if twins.late_updates == "next_round" else None
        self.forecaster = make_forecaster(twins.twin)
        self.history = TwinHistory(self.forecaster.window, history)
        self.on_time = dict(on_time or {})
        self.state_keys: frozenset[str] = frozenset(state_keys)
        self.trust: dict[str, float] = dict(trust or {})  # replaced, never changed in place: callers snapshot it

    def observe_late(self, update: ClientUpdate, round_number: int, trained_from: TensorDict) -> bool:
        """An update for ``round_number`` that arrived after the round closed, trained from the
        global state ``trained_from``: twin history, and held for the next close, only from a
        client recently on time (see the module docstring). Returns whether it was kept."""
        last = self.on_time.get(update.client_id)
        if last is None or (self.max_age is not None and last < round_number - self.max_age):
            return False
        self._observe(update.client_id, round_number, update.params)
        if self.late is not None:
            self.late.hold(update, round_number, trained_from)
        return True

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
        stale = self.late.stand_ins(round_number, current, missing) if self.late is not None else []
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
