"""Model-poisoning attacks a compromised gateway can mount with valid credentials, as tampers on
what it uploads (``run_rounds``'s ``tamper``), so the round engine and the aggregation under test
are the real ones.

- ``scale_x1000``: every weight times 1000 (the probe of issue 12).
- ``value_1e30``: every weight 1e30, finite but absurd.
- ``sign_flip``: the delta from the global state reversed and boosted, theta - 10 (theta_i - theta)
  (the sign-flipping attack of Li et al. 2019, "RSA", boosted as in Bhagoji et al. 2019,
  "Analyzing Federated Learning through an Adversarial Lens"): between the clip and the reject
  bound, so it tests clipping and the robust aggregators rather than rejection.
- ``n_samples_inflation``: the reversed delta theta - (theta_i - theta), claimed for 10**12
  samples: harmless unless the claimed count buys weight.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import replace

from coordinator.simulation.rounds import Tamper
from coordinator.strategies import ClientUpdate
from edge_agent.tensors import TensorDict

SIGN_FLIP_BOOST = 10.0
INFLATED_SAMPLES = 10**12


def _floats(params: TensorDict, change: Callable) -> TensorDict:
    return {k: change(k, t) if t.is_floating_point() else t for k, t in params.items()}


def _reversed(update: ClientUpdate, current: TensorDict, boost: float) -> TensorDict:
    return _floats(update.params, lambda k, t: (current[k] - boost * (t - current[k])).to(t.dtype))


ATTACKS: dict[str, Callable[[ClientUpdate, TensorDict], ClientUpdate]] = {
    "scale_x1000": lambda u, current: replace(u, params=_floats(u.params, lambda k, t: t * 1000)),
    "value_1e30": lambda u, current: replace(u, params=_floats(u.params, lambda k, t: t.new_full(t.shape, 1e30))),
    "sign_flip": lambda u, current: replace(u, params=_reversed(u, current, SIGN_FLIP_BOOST)),
    "n_samples_inflation": lambda u, current: replace(u, params=_reversed(u, current, 1.0),
                                                      n_samples=INFLATED_SAMPLES),
}


def tamper_for(attack: str, attackers: Collection[str]) -> Tamper:
    """The tamper that applies ``attack`` to the updates of the ``attackers`` (client ids)."""
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; choose from {sorted(ATTACKS)}")
    poison = ATTACKS[attack]
    return lambda update, current: poison(update, current) if update.client_id in attackers else update
