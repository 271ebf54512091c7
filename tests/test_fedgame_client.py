"""Fed-GAME's client (section 2.2 (1), (3)): a persistent private model the global state does not
overwrite, the personalized difference applied as eq. 2 (once, however often it arrives), its
state surviving a restart, hostile messages refused by name; and the bytes each method puts on
the wire per client and round."""

from __future__ import annotations

import pytest
import torch

from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.strategy_settings import GameSettings
from coordinator.strategies.fedgame import selected_names
from edge_agent.data import load_site, prepare_client
from edge_agent.learners import HeadLearner
from edge_agent.learners.head import initial_shared_state
from edge_agent.training_settings import HeadTraining
from tests.conftest import small_config

CONFIG = small_config("dlinear", quantiles=(0.1, 0.5, 0.9))
PRIVATE = HeadTraining(batch_size=64, lr=3e-3, private_model=True, prox_mu=0.01, personal_step=0.5)


@pytest.fixture(scope="module")
def data():
    return prepare_client(load_site("miami"), CONFIG.lookback, CONFIG.horizon, stride=24)


def learner(data, training: HeadTraining = PRIVATE) -> HeadLearner:
    return HeadLearner(CONFIG, data, training, seed=3, client_index=0)


def shifted(state: dict[str, torch.Tensor], by: float) -> dict[str, torch.Tensor]:
    return {k: v + by if v.is_floating_point() else v for k, v in state.items()}


def test_the_private_model_takes_the_first_global_state_only_and_uploads_its_own(data) -> None:
    initial = initial_shared_state(CONFIG, 3)
    client = learner(data)
    client.load_global(initial)
    assert all(torch.equal(client.model.shared_state()[k], initial[k]) for k in initial)
    client.train(1)
    uploaded = client.wire_state(1)
    client.load_global(shifted(initial, 1.0))
    kept = client.model.shared_state()
    assert all(torch.equal(kept[k], uploaded[k]) for k in kept)
    assert torch.equal(client.received["shared.backbone.trend.bias"], initial["shared.backbone.trend.bias"] + 1.0)
    plain = learner(data, HeadTraining(batch_size=64, lr=3e-3))
    plain.load_global(initial)
    plain.train(1)
    plain.load_global(shifted(initial, 1.0))
    assert torch.equal(plain.model.shared_state()["shared.backbone.trend.bias"],
                       initial["shared.backbone.trend.bias"] + 1.0)


def test_the_personalized_difference_moves_the_selected_layer_as_eq_2_once(data) -> None:
    initial = initial_shared_state(CONFIG, 3)
    client = learner(data)
    client.load_global(initial)
    client.train(1)
    uploaded = client.wire_state(1)
    names = selected_names(initial, ())
    message = {k: torch.full_like(initial[k], 0.01) for k in names}
    client.load_global(shifted(initial, 0.5))  # the next round's state arrives too; it must not matter
    client.install_personal(message)
    after = client.model.shared_state()
    for k in names:
        own = uploaded[k].double() - initial[k].double()
        expected = uploaded[k].double() + 0.5 * (message[k].double() - own)
        torch.testing.assert_close(after[k].double(), expected, rtol=0, atol=1e-6)
    others = [k for k in after if k not in names]
    assert all(torch.equal(after[k], uploaded[k]) for k in others)
    client.install_personal(message)  # delivered twice
    assert all(torch.equal(client.model.shared_state()[k], after[k]) for k in after)


def test_a_restarted_private_client_has_the_same_model_and_applies_the_same_step(data) -> None:
    initial = initial_shared_state(CONFIG, 3)
    client = learner(data)
    client.load_global(initial)
    client.train(1)
    saved = client.personal_state()
    message = {k: torch.full_like(initial[k], -0.02) for k in selected_names(initial, ())}
    restarted = learner(data)
    restarted.restore(saved)
    restarted.load_global(shifted(initial, 0.5))  # AgentState.restore's order: personal state, then global
    for one in (client, restarted):
        one.install_personal(message)
    mine, theirs = client.model.state_dict(), restarted.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize(("message", "reason"), [
    ({"shared.nowhere.weight": torch.zeros(2)}, "not tensors of the shared model"),
    ({"shared.backbone.trend.bias": torch.zeros(3)}, "personalized difference: shared.backbone.trend.bias is"),
    ({}, "names no tensor"),
])
def test_bad_personal_messages_are_refused_by_name(data, message, reason) -> None:
    client = learner(data)
    client.load_global(initial_shared_state(CONFIG, 3))
    client.train(1)
    with pytest.raises(ValueError, match=reason):
        client.install_personal(message)


def test_a_message_before_any_upload_and_one_to_a_plain_learner_are_refused(data) -> None:
    message = {"shared.backbone.trend.bias": torch.zeros(CONFIG.horizon)}
    with pytest.raises(ValueError, match="before this gateway uploaded"):
        learner(data).install_personal(message)
    with pytest.raises(ValueError, match="set training.private_model = true"):
        learner(data, HeadTraining()).install_personal(message)


def test_fedgame_puts_its_personalized_layer_on_the_wire_on_top_of_fedavg(data) -> None:
    """Per client and round: FedAvg moves the update up and the global state down; Fed-GAME also
    the personalized difference of the selected layer (section 2.5's ratio 1 + rho / 2)."""
    fleet = [data, prepare_client(load_site("amsterdam"), CONFIG.lookback, CONFIG.horizon, stride=24)]
    common = dict(rounds=1, batch_size=64, lr=3e-3, seed=3, test_every_round=False)
    fedavg = run_federation(fleet, CONFIG, FederationConfig(**common)).records[0].wire_bytes
    fedgame = run_federation(fleet, CONFIG, FederationConfig(
        **common, strategy="fedgame", private_model=True, game=GameSettings(steps=2))).records[0].wire_bytes
    initial = initial_shared_state(CONFIG, 3)
    model_bytes = sum(v.numel() * v.element_size() for v in initial.values())
    layer_bytes = sum(initial[k].numel() * initial[k].element_size() for k in selected_names(initial, ()))
    assert 2 * model_bytes < fedavg < 2 * model_bytes + 20_000
    assert layer_bytes < fedgame - fedavg < layer_bytes + 2_000
