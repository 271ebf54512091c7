"""FeDaL: the DBE bias vector, the drift state and its correction against hand-computed values,
core-sets by gradient matching, and in-process pretraining on a mixed fleet of real stations."""

from __future__ import annotations

import pytest
import torch

from coordinator.strategies import ClientInfo, ClientUpdate
from coordinator.strategy_settings import GBESettings
from coordinator.strategies.fedal import FeDaL
from edge_agent.coreset import learn_coreset, nearest_window_correlation, private_coreset
from edge_agent.data import load_site
from edge_agent.data.canonical import device_series
from edge_agent.models.dbe import DomainBiasElimination, decompose
from edge_agent.models.fedal_settings import CoresetSettings, DBESettings
from edge_agent.models.foundation import FoundationModel
from edge_agent.models.foundation_config import FoundationConfig

SMALL = FoundationConfig(window=12, d_model=16, heads=2, layers=1, d_ff=32, dropout=0.0)


def test_trend_is_the_moving_average_with_repeated_ends_and_seasonal_the_rest() -> None:
    hidden = torch.tensor([[[1.0], [2.0], [6.0], [3.0]]])  # (B=1, L=4, D=1)
    trend, seasonal = decompose(hidden, kernel=3)
    # padded: 1 1 2 6 3 3 -> means of 3: (1+1+2)/3, (1+2+6)/3, (2+6+3)/3, (6+3+3)/3
    expected = torch.tensor([4 / 3, 3.0, 11 / 3, 4.0])
    assert torch.allclose(trend.flatten(), expected)
    assert torch.allclose(seasonal.flatten(), hidden.flatten() - expected)


def test_bias_vector_is_scaled_batch_means_of_trend_and_seasonal_then_smoothed() -> None:
    dbe = DomainBiasElimination(window=4, d_model=1, settings=DBESettings(kernel=3, momentum=0.5))
    with torch.no_grad():
        dbe.gamma_trend.fill_(2.0)
        dbe.gamma_seasonal.fill_(10.0)
    first = torch.tensor([[[1.0], [2.0], [6.0], [3.0]], [[3.0], [2.0], [0.0], [3.0]]])
    trend_a, trend_b = torch.tensor([4 / 3, 3.0, 11 / 3, 4.0]), torch.tensor([8 / 3, 5 / 3, 5 / 3, 2.0])
    trend_mean = (trend_a + trend_b) / 2
    seasonal_mean = first.squeeze(-1).mean(0) - trend_mean
    expected = trend_mean * 2.0 + seasonal_mean * 10.0
    dbe.train()
    assert torch.allclose(dbe(first).flatten(), expected)  # the first batch has no history
    second = torch.zeros(1, 4, 1)
    assert torch.allclose(dbe(second).flatten(), 0.5 * expected)  # EMA: 0.5 * old + 0.5 * 0
    dbe.eval()
    assert torch.allclose(dbe(second).flatten(), 0.5 * expected)  # eval mode reads the running bias
    reference = torch.ones(4, 1)
    assert float(dbe.regularization(0.5 * expected[:, None], reference)) == pytest.approx(
        0.1 * float((0.5 * expected - 1).pow(2).mean()))


def test_the_bias_term_trains_the_scales() -> None:
    dbe = DomainBiasElimination(window=4, d_model=2, settings=DBESettings(kernel=3))
    dbe.train()
    loss = dbe.regularization(dbe(torch.randn(3, 4, 2)), torch.zeros(4, 2))
    loss.backward()
    assert dbe.gamma_trend.grad is not None and float(dbe.gamma_trend.grad.abs().sum()) > 0


def updates(*values: float) -> list[ClientUpdate]:
    return [ClientUpdate(f"c{i}", {"w": torch.tensor([v]), "latent_bias": torch.tensor([10.0 * v])}, 1)
            for i, v in enumerate(values)]


def test_drift_state_and_correction_match_the_hand_computed_values() -> None:
    settings = GBESettings(beta=0.5, alpha=1.0, tune_steps=0)
    current = {"w": torch.tensor([1.0]), "latent_bias": torch.tensor([0.0])}
    strategy = FeDaL(current, settings, seed=0)
    roster = {f"c{i}": ClientInfo(f"c{i}", 1) for i in range(4)}  # m = 4 registered, 2 report
    first = strategy.aggregate(1, current, updates(2.0, 4.0), [], roster).global_state
    # FedAvg 3.0; s1 = 0 - 0.5 * ((2-1) + (4-1)) / 4 = -0.5; theta^ = 3 - s1 / 0.5 = 4.0
    assert float(strategy.drift["w"]) == pytest.approx(-0.5)
    assert float(first["w"]) == pytest.approx(4.0)
    assert float(first["latent_bias"]) == pytest.approx(30.0)  # b^g: averaged, never corrected
    second = strategy.aggregate(2, first, updates(5.0, 5.0), [], roster).global_state
    # FedAvg 5.0; s2 = -0.5 - 0.5 * (1 + 1) / 4 = -0.75; theta^ = 5 + 1.5 = 6.5
    assert float(strategy.drift["w"]) == pytest.approx(-0.75)
    assert float(second["w"]) == pytest.approx(6.5)
    restored = FeDaL(current, settings, seed=0)
    restored.load_state_dict(strategy.state_dict())
    assert float(restored.drift["w"]) == pytest.approx(-0.75)


def test_fusion_without_core_sets_keeps_the_corrected_model_and_without_correction_is_fedavg() -> None:
    current = {"w": torch.tensor([1.0]), "latent_bias": torch.tensor([0.0])}
    roster = {f"c{i}": ClientInfo(f"c{i}", 1) for i in range(2)}
    plain = FeDaL(current, GBESettings(correction=False, alpha=0.3), seed=0)
    assert float(plain.aggregate(1, current, updates(2.0, 4.0), [], roster).global_state["w"]) == pytest.approx(3.0)


@pytest.fixture(scope="module")
def station():
    return device_series(load_site("amsterdam").select(["temp_air", "relative_humidity"]), SMALL.variables,
                         SMALL.window, 24)


def test_core_sets_match_gradients_without_copying_a_real_window(station) -> None:
    model = FoundationModel(SMALL)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    settings = CoresetSettings(size=4, steps=15, real_batch=16, lr=0.05)
    coreset = learn_coreset(model, station.train, station.present, settings, patch=3, rate=0.75, seed=1)
    assert coreset.shape == (4, SMALL.window, len(SMALL.variables))
    assert torch.equal(coreset[..., ~station.present], torch.zeros_like(coreset[..., ~station.present]))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched
    correlation = nearest_window_correlation(coreset, station.train, station.present)
    assert -1.0 <= correlation < 0.999
    noisy = private_coreset(coreset, station.present, sigma=1.0, seed=2)
    assert not torch.allclose(noisy, coreset)
    copied = nearest_window_correlation(station.train[:4], station.train, station.present)
    assert copied == pytest.approx(1.0)  # a real window handed over is found exactly


def test_fedal_pretraining_on_a_mixed_fleet_is_reproducible_learns_and_broadcasts_a_bias_reference() -> None:
    from coordinator.simulation.pretrain import pretrain
    from coordinator.simulation.pretrain_config import PretrainConfig
    from edge_agent.data.extra import particulates
    from edge_agent.data.variables import EXTRA_VARIABLES
    from edge_agent.data.resample import mixed_fleet
    from edge_agent.learners.fedal import FedalClientSettings

    fm = SMALL.model_copy(update={"variables": SMALL.variables + EXTRA_VARIABLES})
    tables = mixed_fleet([load_site("amsterdam").select(["temp_air", "pressure"])], ["1h", "3h"], per_variable=False)
    devices = [device_series(t, fm.variables, fm.window, 48) for t in [*tables, particulates()]]
    client = FedalClientSettings(coreset=CoresetSettings(size=2, steps=2, real_batch=8))
    cfg = PretrainConfig(strategy="fedal", client=client, rounds=3, participation=1.0, batch_size=32, lr=3e-3,
                         stride=48, seed=3, server=GBESettings(tune_steps=2))
    model, records = pretrain(devices, fm, cfg)
    again, _ = pretrain(devices, fm, cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    assert records[-1].val_loss < records[0].val_loss
    assert float(model.latent_bias.abs().sum()) > 0  # b^g: the clients' averaged biases
    assert [len(r.devices) for r in records] == [3, 3, 3]
