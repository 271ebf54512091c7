"""Model-poisoning attacks a compromised gateway can mount with valid credentials, as tampers on
what it uploads (``SimulatedGrid``'s ``tamper``) and on what it declares at hello, so the round
engine and the aggregation under test are the real ones.

- ``scale_x1000``: every weight times 1000 (the probe of issue 12).
- ``value_1e30``: every weight 1e30, finite but absurd.
- ``sign_flip``: the delta from the global state reversed and boosted, theta - 10 (theta_i - theta)
  (the sign-flipping attack of Li et al. 2019, "RSA", boosted as in Bhagoji et al. 2019,
  "Analyzing Federated Learning through an Adversarial Lens"): between the clip and the reject
  bound, so it tests clipping and the robust aggregators rather than rejection.
- ``below_screen``: the same reversal rescaled to ``BELOW_SCREEN_BOOST`` (3) times the attacker's own
  honest delta norm, theta - 3 (theta_i - theta): under the clip bound of 4x the round's median delta
  norm, so FedAvg with the engine's bounds takes it whole (issue 27: a live device at 2.7-3.6x the
  honest median raised the honest loss 14% with 1 of 3 clients). The attacker cannot see the others'
  norms; its own honest delta stands in for the round median (honest norms stay within about 1.5x
  of it, so the upload lands at roughly 2-4.5x the median). The "a little is enough" idea of
  Baruch et al. 2019 ("A Little Is Enough: Circumventing Defenses For Distributed Learning"):
  stay inside what the screen accepts, every round.
- ``below_screen_hello``: ``below_screen`` claimed for 10**12 samples at hello and in the update,
  so FedAvg gives it the largest weight the engine allows (3x the fleet's median declared count).
- ``n_samples_inflation``: the reversed delta theta - (theta_i - theta), claimed for 10**12
  samples in the update: harmless unless the claimed count buys weight.
- ``hello_inflation``: the same, with 10**12 samples declared at hello too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, replace

import torch

from coordinator.simulation.grid import Tamper
from coordinator.strategies import ClientUpdate
from edge_agent.tensors import TensorDict

SIGN_FLIP_BOOST = 10.0
BELOW_SCREEN_BOOST = 3.0
INFLATED_SAMPLES = 10**12


def _floats(params: TensorDict, change: Callable) -> TensorDict:
    return {k: change(k, t) if t.is_floating_point() else t for k, t in params.items()}


def _reversed(update: ClientUpdate, current: TensorDict, boost: float) -> TensorDict:
    return _floats(update.params, lambda k, t: (current[k] - boost * (t - current[k])).to(t.dtype))


def _flipped(boost: float) -> Callable[[ClientUpdate, TensorDict], ClientUpdate]:
    """The upload that replaces the delta by its reversal, ``boost`` times as long."""
    return lambda update, current: replace(update, params=_reversed(update, current, boost))


def _flipped_inflated(update: ClientUpdate, current: TensorDict) -> ClientUpdate:
    return replace(_flipped(BELOW_SCREEN_BOOST)(update, current), n_samples=INFLATED_SAMPLES)


def _absurd(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return torch.full_like(tensor, 1e30)


def _inflated(update: ClientUpdate, current: TensorDict) -> ClientUpdate:
    return replace(update, params=_reversed(update, current, 1.0), n_samples=INFLATED_SAMPLES)


@dataclass(frozen=True)
class Attack:
    """What an attacker uploads instead of its update, and the sample count it declares at hello
    (None: its true count)."""

    upload: Callable[[ClientUpdate, TensorDict], ClientUpdate]
    hello_samples: int | None = None


ATTACKS: dict[str, Attack] = {
    "scale_x1000": Attack(lambda u, current: replace(u, params=_floats(u.params, lambda k, t: t * 1000))),
    "value_1e30": Attack(lambda u, current: replace(u, params=_floats(u.params, _absurd))),
    "sign_flip": Attack(_flipped(SIGN_FLIP_BOOST)),
    "below_screen": Attack(_flipped(BELOW_SCREEN_BOOST)),
    "below_screen_hello": Attack(_flipped_inflated, INFLATED_SAMPLES),
    "n_samples_inflation": Attack(_inflated),
    "hello_inflation": Attack(_inflated, INFLATED_SAMPLES),
}


def _known(attack: str) -> Attack:
    if attack not in ATTACKS:
        raise ValueError(f"unknown attack {attack!r}; choose from {sorted(ATTACKS)}")
    return ATTACKS[attack]


def tamper_for(attack: str, attackers: Collection[str]) -> Tamper:
    """The tamper that applies ``attack`` to the updates of the ``attackers`` (client ids)."""
    upload = _known(attack).upload
    return lambda update, current: upload(update, current) if update.client_id in attackers else update


def claims_for(attack: str, attackers: Collection[str]) -> dict[str, int]:
    """The sample counts the ``attackers`` declare at hello under ``attack`` (empty: the truth)."""
    claimed = _known(attack).hello_samples
    return {} if claimed is None else {client: claimed for client in attackers}
