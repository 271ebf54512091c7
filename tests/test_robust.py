"""Robust aggregation: the engine's screening (weights bounded by hello, non-finite and norm
outliers rejected, large deltas clipped), the coordinate-wise median and trimmed mean, server-side
clipping with noise, and a poisoned fleet in the simulation."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from coordinator.engine import RoundEngine
from coordinator.simulation.attacks import ATTACKS, INFLATED_SAMPLES, tamper_for
from coordinator.simulation.federation import run_federation
from coordinator.simulation.federation_config import FederationConfig
from coordinator.strategies import ClientInfo, ClientUpdate, make_strategy
from coordinator.strategy_settings import NoiseSettings, RobustSettings, StrategySettings
from coordinator.strategies.bounds import delta_norm, screen
from coordinator.twin_settings import TwinSettings
from edge_agent.data import build_pool, feature_clients, load_sites
from tests.conftest import small_config

CURRENT = {"w": torch.zeros(3), "steps": torch.tensor(4)}
HONEST = [[1.0, 2.0, 3.0], [1.5, 2.5, 2.0], [0.5, 1.5, 2.5], [1.2, 1.8, 2.8], [0.8, 2.2, 3.2]]
NO_BOUNDS = RobustSettings(clip_factor=None, reject_factor=None, min_cosine=None, trust_rate=None)
FORMER_BOUNDS = RobustSettings(min_cosine=None, trust_rate=None)  # the bounds of one round: norms only


def update(client: str, values: list[float], n: int = 10) -> ClientUpdate:
    return ClientUpdate(client, {"w": torch.tensor(values), "steps": torch.tensor(4)}, n, {"loss": 1.0})


def roster(n: int, samples: int = 10) -> list[ClientInfo]:
    return [ClientInfo(f"c{i}", samples) for i in range(n)]


def close(strategy: str, updates: list[ClientUpdate], robust: RobustSettings = RobustSettings(), seed: int = 0):
    """One round through the real engine (twins off), as the service closes it."""
    settings = StrategySettings(strategy=strategy, robust=robust)
    engine = RoundEngine(make_strategy(settings, CURRENT, seed), TwinSettings(twin="drop"), robust=robust)
    return engine.close(1, CURRENT, updates, roster(len(updates)))


def fleet_with(poison: list[float], n_samples: int = 10) -> list[ClientUpdate]:
    return [update(f"c{i}", v) for i, v in enumerate(HONEST)] + [update("c5", poison, n_samples)]


@pytest.mark.parametrize("strategy", ["median", "trimmed_mean"])
@pytest.mark.parametrize("poison", [[1e6, -1e6, 1e6], [1e30, 1e30, 1e30], [-3.0, 5.0, -7.0]])
def test_robust_aggregators_stay_within_the_honest_range(strategy: str, poison: list[float]) -> None:
    result = close(strategy, fleet_with(poison), NO_BOUNDS)
    honest = torch.tensor(HONEST)
    assert bool((result.global_state["w"] >= honest.min(0).values).all())
    assert bool((result.global_state["w"] <= honest.max(0).values).all())
    assert result.global_state["steps"].dtype == torch.int64 and int(result.global_state["steps"]) == 4


def test_median_and_trimmed_mean_by_hand() -> None:
    values = [[1.0], [2.0], [3.0], [4.0], [100.0], [-50.0], [5.0]]
    updates = [update(f"c{i}", v * 3) for i, v in enumerate(values)]
    assert close("median", updates, NO_BOUNDS).global_state["w"].tolist() == [3.0] * 3
    # beta 0.2 of 7: ceil(1.4) = 2 cut from each end -> mean of 2, 3, 4
    assert close("trimmed_mean", updates, NO_BOUNDS).global_state["w"].tolist() == [3.0] * 3
    even = close("median", updates[:4], NO_BOUNDS).global_state["w"]
    assert even.tolist() == [2.5] * 3


def test_fedavg_without_bounds_is_moved_by_one_poisoned_client() -> None:
    result = close("fedavg", fleet_with([1e6, 1e6, 1e6]), NO_BOUNDS)
    assert float(result.global_state["w"].max()) > 1e5


def test_weight_is_bounded_by_the_hello_and_the_cap() -> None:
    liar = fleet_with(HONEST[0], n_samples=INFLATED_SAMPLES)
    weights = [u.n_samples for u in screen(CURRENT, liar, {c.client_id: c for c in roster(6)}, NO_BOUNDS).accepted]
    assert weights == [10] * 6
    capped = RobustSettings(max_samples=4, clip_factor=None, reject_factor=None, min_cosine=None)
    assert {u.n_samples for u in screen(CURRENT, liar, {c.client_id: c for c in roster(6)}, capped).accepted} == {4}
    liar_roster = {**{c.client_id: c for c in roster(5)}, "c5": ClientInfo("c5", INFLATED_SAMPLES)}
    assert screen(CURRENT, liar, liar_roster, RobustSettings()).accepted[-1].n_samples == 30  # 3 x median 10
    poisoned = close("fedavg", fleet_with([-100.0, -100.0, -100.0], n_samples=INFLATED_SAMPLES),
                     NO_BOUNDS)
    assert poisoned.global_state["w"].tolist() == pytest.approx(
        ((torch.tensor(HONEST).sum(0) - 100) / 6).tolist(), rel=1e-6)


def test_outliers_are_rejected_with_codes_and_large_deltas_clipped() -> None:
    updates = fleet_with([math.nan, 1.0, 1.0])
    updates[0] = update("c0", [1e3, 0.0, 0.0])  # norm ~ 300x the median: rejected
    updates[1] = update("c1", [20.0, 0.0, 0.0])  # norm 20 > 4 x median (3.96): clipped
    result = close("fedavg", updates)
    assert result.rejected == {"c0": "norm_outlier", "c5": "not_finite"}
    assert result.clipped == ("c1",) and result.on_time == ("c1", "c2", "c3", "c4")
    screened = screen(CURRENT, updates, {c.client_id: c for c in roster(6)}, RobustSettings())
    clipped = next(u for u in screened.accepted if u.client_id == "c1")
    assert float(clipped.params["w"].norm()) == pytest.approx(4 * screened.median_norm, rel=1e-5)
    assert not math.isnan(result.loss)


def test_an_unregistered_client_and_an_all_rejected_round_leave_the_state_alone() -> None:
    strangers = [update("stranger", [1.0, 1.0, 1.0]), update("c0", [math.inf, 0.0, 0.0])]
    engine = RoundEngine(make_strategy(StrategySettings(), CURRENT, 0), TwinSettings(twin="drop"),
                         robust=RobustSettings())
    result = engine.close(1, CURRENT, strangers, roster(1))
    assert result.rejected == {"c0": "not_finite", "stranger": "unregistered"}
    assert result.global_state is CURRENT and result.on_time == ()


def test_settings_are_strict_and_explain_themselves() -> None:
    with pytest.raises(ValidationError, match="below clip_factor"):
        RobustSettings(clip_factor=10.0, reject_factor=5.0)
    with pytest.raises(ValidationError):
        RobustSettings(clip_factor="4")
    with pytest.raises(ValidationError):
        StrategySettings(robust={"trim_fraction": 0.5})
    with pytest.raises(ValidationError):
        NoiseSettings(clip_norm=0.0)


def test_server_noise_is_reproducible_per_seed_and_round() -> None:
    updates = [update(f"c{i}", v) for i, v in enumerate(HONEST)]
    first, again = close("dp_fedavg", updates, seed=1), close("dp_fedavg", updates, seed=1)
    other = close("dp_fedavg", updates, seed=2)
    assert torch.equal(first.global_state["w"], again.global_state["w"])
    assert not torch.equal(first.global_state["w"], other.global_state["w"])
    quiet = StrategySettings(strategy="dp_fedavg", noise=NoiseSettings(clip_norm=1.0, noise_multiplier=0.0))
    strategy = make_strategy(quiet, CURRENT, 0)
    state = strategy.aggregate(1, CURRENT, updates, [], {}).global_state
    assert float(state["w"].norm()) <= 1.0 + 1e-6  # each delta clipped to S = 1, mean of unit vectors


@pytest.fixture(scope="module")
def stations():
    return feature_clients(build_pool(load_sites()), 4, 4, 42, lookback=24, horizon=12, stride=193, val_stride=97)


def honest_mse(stations, attack: str | None, **aggregation) -> float:
    """The honest clients' mean test MSE after 2 rounds with the first station mounting ``attack``
    (None: clean), under ``aggregation`` (FederationConfig's strategy fields; none: the defaults)."""
    fed = FederationConfig(rounds=2, batch_size=64, lr=3e-3, seed=1, test_every_round=False, tested_round="last",
                           **aggregation)
    attacker = stations[0].name
    result = run_federation(stations, small_config("dlinear"), fed,
                            tamper=tamper_for(attack, {attacker}) if attack else None)
    return sum(m.mse for name, m in result.client_test.items() if name != attacker) / (len(stations) - 1)


def test_one_attacker_ruins_fedavg_but_not_the_robust_path(stations) -> None:
    clean = honest_mse(stations, None, strategy="fedavg")
    assert not honest_mse(stations, "scale_x1000", strategy="fedavg", robust=NO_BOUNDS) < 10 * clean  # NaN or far off
    for strategy in ("fedavg", "median"):
        assert honest_mse(stations, "scale_x1000", strategy=strategy) < 1.1 * clean


def test_the_below_screen_flip_is_reversed_at_3x_its_own_norm_and_passes_the_4x_screen() -> None:
    """The attack of issue 27: a reversed delta at 3x the attacker's own honest norm lands between
    2x and 4x the round's median, so the 4x clip and the 20x reject let it through whole."""
    honest = [update(f"c{i}", v) for i, v in enumerate(HONEST)]
    flipped = ATTACKS["below_screen"].upload(honest[0], CURRENT)
    assert flipped.params["w"].tolist() == pytest.approx([-3.0 * v for v in HONEST[0]])
    norm = delta_norm(CURRENT, flipped.params)
    assert norm == pytest.approx(3 * delta_norm(CURRENT, honest[0].params))
    screened = screen(CURRENT, [flipped, *honest[1:]], {c.client_id: c for c in roster(5)}, FORMER_BOUNDS)
    assert not screened.clipped and not screened.rejected
    assert 2 < norm / screened.median_norm < 4


def honest_progress(strategy: str, robust: RobustSettings) -> float:
    """One round of 7 clients whose deltas share a direction (plus noise), the first mounting the
    below-screen flip: the share of the honest mean step the aggregate keeps along that step."""
    torch.manual_seed(0)
    honest = [update(f"c{i}", (torch.tensor([1.0, 2.0, 3.0]) + 0.5 * torch.randn(3)).tolist()) for i in range(7)]
    step = torch.stack([u.params["w"] for u in honest[1:]]).mean(0)
    updates = [ATTACKS["below_screen"].upload(honest[0], CURRENT), *honest[1:]]
    state = close(strategy, updates, robust).global_state["w"]
    return float(state @ step / (step @ step))


def test_one_below_screen_flipper_of_7_moves_the_direction_check_less_than_the_norm_bounds() -> None:
    """With the direction check, FedAvg keeps more of the honest step against one below-screen sign
    flipper than with the default bounds (norms only: deltas clipped at 4x the round median),
    which take the flipped delta whole: (6 - 3) / 7 of the step."""
    assert honest_progress("fedavg", FORMER_BOUNDS) == pytest.approx(3 / 7, abs=0.1)
    assert honest_progress("fedavg", RobustSettings(min_cosine=0.0)) > 0.8


def test_a_large_count_and_a_large_delta_do_not_multiply() -> None:
    """Issue 27: the below-screen flip from a client that declared 10**12 samples at hello gets
    the weight cap (3x the median count) and passes the norm clip at 3x the median norm; its
    weight is then cut so that weight x norm is at most 4x the round's median pull."""
    honest = [update(f"c{i}", v) for i, v in enumerate(HONEST)]
    flipped = ATTACKS["below_screen"].upload(honest[0], CURRENT)
    liar_roster = {**{c.client_id: c for c in roster(5)}, "c0": ClientInfo("c0", INFLATED_SAMPLES)}
    flipped = ClientUpdate("c0", flipped.params, INFLATED_SAMPLES, flipped.metrics)
    screened = screen(CURRENT, [flipped, *honest[1:]], liar_roster, RobustSettings())
    norms = [delta_norm(CURRENT, u.params) for u in screened.accepted]
    pulls = sorted(10 * n for n in norms[1:]) + [30 * norms[0]]
    limit = 4 * sorted(pulls)[len(pulls) // 2]
    assert screened.clipped == ("c0",) and not screened.rejected
    assert screened.accepted[0].n_samples == int(limit / norms[0]) < 30
    assert [u.n_samples for u in screened.accepted[1:]] == [10] * 4
    equal = screen(CURRENT, [ATTACKS["below_screen"].upload(honest[0], CURRENT), *honest[1:]],
                   {c.client_id: c for c in roster(5)}, RobustSettings())
    assert not equal.clipped and [u.n_samples for u in equal.accepted] == [10] * 5  # equal counts: the norm clip alone


def test_site_aggregators_pull_with_their_gateways_weight() -> None:
    updates = [update(f"c{i}", v) for i, v in enumerate(HONEST)]
    updates[0] = update("c0", HONEST[0], n=500)
    sites = {**{c.client_id: c for c in roster(5)}, "c0": ClientInfo("c0", 500)}
    screened = screen(CURRENT, updates, sites, RobustSettings(site_clients=["c0"]))
    assert screened.accepted[0].n_samples == 500 and not screened.clipped


def test_an_update_against_the_median_delta_is_rejected_with_its_code() -> None:
    flipped = [update("c0", [-0.5 * v for v in HONEST[0]]), *[update(f"c{i}", v) for i, v in enumerate(HONEST[1:], 1)]]
    result = close("fedavg", flipped, RobustSettings(min_cosine=0.0))
    assert result.rejected == {"c0": "against_median"} and result.on_time == ("c1", "c2", "c3", "c4")
    assert close("fedavg", flipped[:2], RobustSettings(min_cosine=0.0)).rejected == {}  # under 3: no check


def test_attack_names_are_checked() -> None:
    with pytest.raises(ValueError, match=str(sorted(ATTACKS))[1:-1]):
        tamper_for("scale_x10", {"c0"})


def test_the_screen_and_a_decoded_state_do_not_depend_on_the_order_a_dict_was_built_in() -> None:
    """safetensors hands decoded tensors over in a hash order that changes per process; the
    screen's norms (and the pull bound's floor on them) sum in name order, so a state read back
    from the store screens exactly as the one in memory, and decoding gives name order."""
    from edge_agent.tensors import tensors_from_bytes, tensors_to_bytes

    generator = torch.Generator().manual_seed(5)
    current = {f"layer{i:02d}.weight": torch.randn(97, generator=generator) for i in range(24)}
    updates = [ClientUpdate(f"c{k}", {n: t + 0.01 * (k + 1) * torch.randn(97, generator=generator)
                                      for n, t in current.items()}, 100 + k) for k in range(5)]
    roster = {u.client_id: ClientInfo(u.client_id, u.n_samples) for u in updates}
    settings = RobustSettings(clip_factor=1.0)

    def reordered(state: dict) -> dict:
        return dict(reversed(list(state.items())))

    forward = screen(current, updates, roster, settings)
    backward = screen(reordered(current), [ClientUpdate(u.client_id, reordered(u.params), u.n_samples)
                                           for u in updates], roster, settings)
    assert forward.median_norm == backward.median_norm  # bit for bit
    assert [u.n_samples for u in forward.accepted] == [u.n_samples for u in backward.accepted]
    assert delta_norm(current, updates[0].params) == delta_norm(reordered(current), reordered(updates[0].params))
    assert list(tensors_from_bytes(tensors_to_bytes(reordered(current)))) == sorted(current)
