"""The GAME aggregator (Fed-GAME section 2.3): attention rows, top-k gates, determinism, meta-
training on structured differences, the mean ablation, state round trip; and the FedGAME
strategy (section 2.2) through the round engine."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from coordinator.engine import RoundEngine
from coordinator.strategies import ClientInfo, ClientUpdate, make_strategy
from coordinator.strategy_settings import RobustSettings, StrategySettings
from coordinator.strategies.fedgame import selected_names
from coordinator.strategies.game import GameAggregator, GameSettings, meta_loss
from coordinator.twin_settings import TwinSettings

FEATURES, PER_GROUP = 40, 3


def two_groups(seed: int = 0, scale: float = 1e-3) -> torch.Tensor:
    """(6, FEATURES) differences: two groups of three clients, each near its group's centre."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(2, FEATURES, generator=generator)
    rows = [centre + 0.1 * torch.randn(PER_GROUP, FEATURES, generator=generator) for centre in centres]
    return torch.cat(rows) * scale


def within_group_share(attention: torch.Tensor) -> float:
    """Mean attention mass a client puts on its own group's other members (uniform: 2/5)."""
    group = torch.arange(len(attention)) // PER_GROUP
    return (attention * (group[:, None] == group[None, :])).sum(1).mean().item()


def aggregator(**overrides: object) -> GameAggregator:
    return GameAggregator(FEATURES, GameSettings(max_clients=8, **overrides), seed=1)


@pytest.mark.parametrize("variant", ["game", "gat", "mean"])
def test_attention_rows_sum_to_one_over_peers_only(variant: str) -> None:
    model = aggregator(variant=variant)
    for training in (False, True):
        model.train(training)
        attention = model.attention(two_groups(), generator=torch.Generator().manual_seed(0)).detach()
        torch.testing.assert_close(attention.sum(1), torch.ones(6))
        assert (attention >= 0).all() and (attention.diagonal() == 0).all()


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_every_gate_keeps_exactly_top_k_experts_with_and_without_noise(top_k: int) -> None:
    model = aggregator(top_k=top_k)
    h = model.encoder(two_groups() / 1e-3)
    for training in (False, True):
        model.train(training)
        gates = model.gates(h, torch.arange(6), torch.Generator().manual_seed(0)).detach()
        assert ((gates > 0).sum(1) == top_k).all()
        torch.testing.assert_close(gates.sum(1), torch.ones(6))


def test_gate_noise_only_while_training_and_seeded() -> None:
    model = aggregator()
    h, slots = model.encoder(two_groups() / 1e-3).detach(), torch.arange(6)
    assert torch.equal(model.gates(h, slots), model.gates(h, slots))
    model.train()
    noisy = [model.gates(h, slots, torch.Generator().manual_seed(s)) for s in (5, 5, 6)]
    assert torch.equal(noisy[0], noisy[1]) and not torch.equal(noisy[0], noisy[2])


def test_same_seeds_give_identical_training_and_outputs() -> None:
    runs = []
    for _ in range(2):
        model = aggregator(lr=1e-2)
        losses = model.fit(two_groups(), steps=5, lr=1e-2, seed=3)
        runs.append((losses, model(two_groups()).detach()))
    assert runs[0][0] == runs[1][0] and torch.equal(runs[0][1], runs[1][1])
    other = GameAggregator(FEATURES, GameSettings(max_clients=8), seed=2)
    assert not torch.equal(other(two_groups()), aggregator()(two_groups()))


def test_meta_training_lowers_the_loss_and_attends_within_the_group() -> None:
    differences = two_groups()
    model = aggregator()
    before = within_group_share(model.attention(differences).detach())
    losses = model.fit(differences, steps=100, lr=1e-2, seed=3)
    after = within_group_share(model.attention(differences).detach())
    assert losses[-1] < 0.5 * losses[0]
    assert after > 0.9 and after > before + 0.3  # uniform over peers would give 0.4


@pytest.mark.parametrize(("variant", "trained", "untouched"), [
    ("game", ("encoder.weight", "experts", "gate_weight"), ("gat.weight",)),
    ("gat", ("encoder.weight", "gat.weight"), ("experts", "gate_weight", "gate_bias", "noise_weight")),
])
def test_each_variant_trains_only_its_own_scoring(variant: str, trained: tuple[str, ...],
                                                  untouched: tuple[str, ...]) -> None:
    model = aggregator(variant=variant)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fit(two_groups(), steps=3, lr=1e-2, seed=0)
    after = model.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in trained)
    assert all(torch.equal(before[k], after[k]) for k in untouched)


def test_the_mean_variant_is_the_plain_mean_of_the_peers() -> None:
    differences = two_groups()
    model = aggregator(variant="mean", balance=0.25)
    assert model.fit(differences, steps=3, lr=1e-2, seed=0)[0] > 0  # nothing to train, loss still reported
    by_hand = torch.stack([torch.cat([differences[:i], differences[i + 1:]]).mean(0) for i in range(6)])
    torch.testing.assert_close(model(differences), 0.25 * differences + 0.75 * by_hand)


def test_a_lone_client_keeps_its_own_difference() -> None:
    difference = two_groups()[:1]
    torch.testing.assert_close(aggregator()(difference), difference)


def test_meta_loss_is_zero_for_a_perfect_match_and_counts_both_terms() -> None:
    target = two_groups() / 1e-3
    assert meta_loss(target, target, 1.0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    l2_only, cos_only = meta_loss(-target, target, 1.0, 0.0), meta_loss(-target, target, 0.0, 1.0)
    assert cos_only.item() == pytest.approx(2.0)
    torch.testing.assert_close(meta_loss(-target, target, 1.0, 1.0), l2_only + cos_only)


def test_state_round_trip_gives_identical_outputs() -> None:
    differences = two_groups()
    trained = aggregator()
    trained.fit(differences, steps=10, lr=1e-2, seed=3)
    state = trained.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    restored = GameAggregator(FEATURES, GameSettings(max_clients=8), seed=99)
    restored.load_state_dict(state)
    assert torch.equal(restored(differences), trained(differences))
    assert restored.fit(differences, 2, 1e-2, 4) == trained.fit(differences, 2, 1e-2, 4)


def test_settings_reject_unknown_variants_and_top_k_above_experts() -> None:
    with pytest.raises(ValueError, match="variant"):
        GameSettings(variant="sage")
    with pytest.raises(ValueError, match="top_k"):
        GameSettings(experts=2, top_k=3)


# The FedGAME strategy through the round engine.

CURRENT = {"body.weight": torch.zeros(4, 3), "head.weight": torch.zeros(2, 4), "head.bias": torch.zeros(2),
           "steps": torch.tensor(3)}
NO_BOUNDS = RobustSettings(clip_factor=None, reject_factor=None, min_cosine=None, trust_rate=None)


def client_states(seed: int = 0) -> list[ClientUpdate]:
    """Four clients, two groups: head differences near their group's centre, bodies random."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(2, 10, generator=generator)
    updates = []
    for i in range(4):
        head = centres[i // 2] + 0.1 * torch.randn(10, generator=generator)
        params = {"body.weight": torch.randn(4, 3, generator=generator), "head.weight": head[:8].reshape(2, 4),
                  "head.bias": head[8:], "steps": torch.tensor(3 + i)}
        updates.append(ClientUpdate(f"c{i}", params, n_samples=10 * (i + 1)))
    return updates


def engine(strategy: str = "fedgame", seed: int = 0, **game: object) -> RoundEngine:
    settings = StrategySettings(strategy=strategy, game=GameSettings(steps=20, lr=1e-2, **game))
    return RoundEngine(make_strategy(settings, CURRENT, seed), TwinSettings(twin="drop"), robust=NO_BOUNDS)


ROSTER = [ClientInfo(f"c{i}", 10 * (i + 1)) for i in range(4)]


def test_fedgame_steps_the_global_model_by_the_server_lr_and_personalizes_the_head() -> None:
    fedavg = engine("fedavg").close(1, CURRENT, client_states(), ROSTER).global_state
    result = engine(server_lr=0.5).close(1, CURRENT, client_states(), ROSTER)
    for name in ("body.weight", "head.weight", "head.bias"):
        torch.testing.assert_close(result.global_state[name], 0.5 * fedavg[name])
    assert result.global_state["steps"].dtype == torch.int64
    assert sorted(result.personal) == ["c0", "c1", "c2", "c3"] and "meta_loss" in result.metrics
    for update in client_states():
        mine = result.personal[update.client_id]
        assert sorted(mine) == ["head.bias", "head.weight"]
        assert all(mine[k].shape == CURRENT[k].shape for k in mine)
    assert not torch.equal(result.personal["c0"]["head.weight"], result.personal["c2"]["head.weight"])


def test_fedgame_with_eta_one_equals_fedavg_and_the_mean_variant_mixes_the_peers() -> None:
    updates = client_states()
    fedavg = engine("fedavg").close(1, CURRENT, updates, ROSTER).global_state
    result = engine(server_lr=1.0, variant="mean", balance=0.5).close(1, CURRENT, updates, ROSTER)
    assert all(torch.equal(result.global_state[k], fedavg[k]) for k in CURRENT)
    heads = [u.params["head.bias"] for u in updates]
    expected = 0.5 * heads[0] + 0.5 * torch.stack(heads[1:]).mean(0)
    torch.testing.assert_close(result.personal["c0"]["head.bias"], expected)


def test_fedgame_resumes_from_its_safetensors_state_after_a_restart() -> None:
    steady = engine()
    steady.close(1, CURRENT, client_states(0), ROSTER)
    uninterrupted = steady.close(2, CURRENT, client_states(1), ROSTER)
    before = engine()
    before.close(1, CURRENT, client_states(0), ROSTER)
    saved = safetensors.torch.load(safetensors.torch.save(before.strategy.state_dict()))  # as the store keeps it
    restarted = engine(seed=0)
    restarted.strategy.load_state_dict(saved)
    resumed = restarted.close(2, CURRENT, client_states(1), ROSTER)
    assert restarted.strategy.clients == ["c0", "c1", "c2", "c3"]
    assert all(torch.equal(resumed.personal[c][k], uninterrupted.personal[c][k])
               for c in uninterrupted.personal for k in uninterrupted.personal[c])


def test_fedgame_selects_the_final_layer_or_the_named_prefixes() -> None:
    assert selected_names(CURRENT, ()) == ("head.weight", "head.bias")
    assert selected_names(CURRENT, ("body.",)) == ("body.weight",)
    with pytest.raises(ValueError, match="no floating tensor"):
        selected_names(CURRENT, ("missing.",))


def test_in_head_mode_the_final_layer_is_the_backbones_last_weight_matrix() -> None:
    """The backbone feeds each gateway's own head, so its last linear layer is the shared model's
    final layer (the QAP input stage, later in the state's order, is not)."""
    from edge_agent.learners.head import initial_shared_state
    from tests.conftest import small_config

    state = initial_shared_state(small_config("dlinear"), 0)
    assert selected_names(state, ()) == ("shared.backbone.trend.weight", "shared.backbone.trend.bias")
    assert list(state)[-1].startswith("shared.qap.")
