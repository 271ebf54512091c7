"""FedPoD prompt mode: frozen backbone, prompt-only wire payload, every term of the local loss."""

from __future__ import annotations

import json

import pytest
import torch

from coordinator.simulation.pretrain import pretrain
from coordinator.simulation.pretrain_config import PretrainConfig
from edge_agent.data import load_site, load_sites
from edge_agent.data.canonical import device_series
from edge_agent.models.foundation import content_hash
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.models.prompt_settings import PromptConfig
from edge_agent.models.prompts import PromptedForecaster, PromptLoss, evaluate_prompts, prompt_forecasts, train_prompts
from edge_agent.protocol import signature
from edge_agent.train import forecast_metrics

FM = FoundationConfig(window=24, d_model=32, heads=2, layers=1, d_ff=64, dropout=0.1)
PROMPTS = PromptConfig(lookback=12, horizon=12)
LEVELS = (0.1, 0.5, 0.9)
# the wire layout of PROMPTS on FM before prompt mode had quantile levels (commit 42444e4)
POINT_LAYOUT = {"prompts.spatial": (8,), "prompts.temporal": (12, 9), "prompts.variable": (24, 9),
                "shared.spatial.0.weight": (9, 10), "shared.spatial.0.bias": (9,), "shared.spatial.1.weight": (9,),
                "shared.spatial.1.bias": (9,), "shared.head.0.weight": (32, 32), "shared.head.0.bias": (32,),
                "shared.head.2.weight": (9, 32), "shared.head.2.bias": (9,)}


@pytest.fixture(scope="module")
def foundation():
    devices = [device_series(t, FM.variables, FM.window, stride=24) for t in load_sites()]
    model, _ = pretrain(devices, FM, PretrainConfig(rounds=2, participation=1.0, batch_size=32, lr=3e-3, stride=24))
    return model


@pytest.fixture(scope="module")
def station():
    return device_series(load_site("amsterdam"), FM.variables, FM.window, stride=6)


def test_local_training_leaves_the_foundation_bit_identical_and_improves_the_forecast(foundation, station) -> None:
    before = content_hash(foundation)
    model = PromptedForecaster(foundation, PROMPTS, 52.3, 4.8)
    untrained = evaluate_prompts(model, station.val, station.present)
    train_prompts(model, PromptLoss(), station.train, station.present, epochs=3, batch_size=64, lr=1e-2, seed=1)
    assert content_hash(model.foundation) == before
    assert not any(p.requires_grad for p in model.foundation.parameters())
    mae, rmse = evaluate_prompts(model, station.val, station.present)
    assert rmse < 0.95 * untrained[1]  # at least 5% better than the untrained prompts


def test_only_prompts_and_small_shared_layers_go_on_the_wire(foundation) -> None:
    model = PromptedForecaster(foundation, PROMPTS, 52.3, 4.8)
    wire = model.wire_state()
    assert {"prompts.temporal", "prompts.variable", "prompts.spatial"} <= wire.keys()
    assert all(k.startswith(("prompts.", "shared.")) for k in wire)  # no foundation., no weights.
    wire_bytes = sum(t.numel() * t.element_size() for t in wire.values())
    fm_bytes = sum(t.numel() * t.element_size() for t in foundation.state_dict().values())
    assert wire_bytes < 0.25 * fm_bytes
    assert wire["prompts.temporal"].shape == (12, len(FM.variables))


def test_every_term_of_the_local_loss_is_computed_and_trains_xi_and_tau() -> None:
    loss = PromptLoss(xi=0.7, tau=0.3)
    prompts = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    forecast, target = torch.zeros(2, 3), torch.ones(2, 3)
    terms = loss(forecast, target, prompts, global_prompts=torch.zeros(3), personalized=torch.ones(3),
                 neighbours=[torch.zeros(3), torch.full((3,), 2.0)])
    assert set(terms) == {"mse", "global", "personalized", "neighbours", "uncertainty", "total"}
    assert terms["mse"].item() == pytest.approx(1.0)
    assert terms["global"].item() == pytest.approx((1 + 4 + 9) / 3 / 0.49, rel=1e-5)
    assert terms["personalized"].item() == pytest.approx((0 + 1 + 4) / 3 / 0.49, rel=1e-5)
    assert terms["neighbours"].item() == pytest.approx(((14 / 3) + (2 / 3)) / 2 / 0.09, rel=1e-5)
    expected = 4 * (torch.log2(torch.tensor(0.7)) + torch.log2(torch.tensor(0.3)))
    assert terms["uncertainty"].item() == pytest.approx(expected.item(), rel=1e-5)
    terms["total"].backward()
    assert loss.xi_logit.grad != 0 and loss.tau_logit.grad != 0 and prompts.grad is not None
    plain = loss(forecast, target, prompts)
    assert set(plain) == {"mse", "total"}  # first round: no references yet


def test_task_one_forecasts_one_target_and_bad_configs_are_refused(foundation, station) -> None:
    model = PromptedForecaster(foundation, PromptConfig(task="single", target="temp_air"), 52.3, 4.8)
    assert model(station.val[:4, :12]).shape == (4, 12, 1)
    with pytest.raises(ValueError, match="target"):
        PromptedForecaster(foundation, PromptConfig(task="single", target="snow"), 0.0, 0.0)
    with pytest.raises(ValueError, match="foundation window"):
        PromptedForecaster(foundation, PromptConfig(lookback=12, horizon=24), 0.0, 0.0)


def test_the_agent_side_learner_adopts_personal_prompts_and_noises_its_upload(foundation, tmp_path) -> None:
    from edge_agent.config import AgentConfig
    from edge_agent.learners import PromptLearner, make_learner
    from edge_agent.models.foundation import save_foundation

    digest = save_foundation(foundation, tmp_path / "fm.safetensors")
    cfg = AgentConfig(fleet="f", client_id="a", state_dir=tmp_path / "a", data={"site": "miami"}, mode="prompt",
                      foundation=tmp_path / "fm.safetensors", foundation_sha256=digest, dp_sigma=0.5,
                      training={"stride": 48})
    learner = make_learner(cfg, load_site("miami"))
    assert isinstance(learner, PromptLearner)
    size = learner.model.prompt_vector().numel()
    sent = torch.arange(size, dtype=torch.float32)
    learner.install_personal({"personalized": sent, "global_prompts": sent * 0, "neighbours": torch.zeros(2, size)})
    torch.testing.assert_close(learner.model.prompt_vector().detach(), sent)
    assert len(learner.references["neighbours"]) == 2
    noisy = learner.wire_state(1)["prompts.temporal"] - learner.model.prompts["temporal"].detach()
    assert 0.3 < noisy.std().item() < 0.7  # the upload is noised, the local prompts are not
    torch.testing.assert_close(learner.wire_state(1)["prompts.temporal"], learner.wire_state(1)["prompts.temporal"])
    assert not torch.equal(learner.wire_state(1)["prompts.temporal"], learner.wire_state(2)["prompts.temporal"])
    with pytest.raises(ValueError, match="neighbours"):
        learner.install_personal({"personalized": sent, "global_prompts": sent, "neighbours": torch.zeros(2, 3)})
    with pytest.raises(ValueError, match="personalized"):
        learner.install_personal({"personalized": sent[:-1], "global_prompts": sent})
    with pytest.raises(ValueError, match="prompt"):
        AgentConfig(fleet="f", client_id="a", state_dir=tmp_path, data={"site": "miami"}, mode="prompt")


def test_a_restored_prompt_learner_keeps_its_prompts_and_regularization_targets(foundation, tmp_path) -> None:
    from edge_agent.config import AgentConfig
    from edge_agent.learners import make_learner
    from edge_agent.models.foundation import save_foundation

    digest = save_foundation(foundation, tmp_path / "fm.safetensors")
    cfg = AgentConfig(fleet="f", client_id="a", state_dir=tmp_path / "a", data={"site": "miami"}, mode="prompt",
                      foundation=tmp_path / "fm.safetensors", foundation_sha256=digest, training={"stride": 48})
    learner = make_learner(cfg, load_site("miami"))
    size = learner.model.prompt_vector().numel()
    learner.install_personal({"personalized": torch.randn(size), "global_prompts": torch.randn(size),
                              "neighbours": torch.randn(1, size)})
    learner.train(1)
    again = make_learner(cfg, load_site("miami"))
    again.restore(learner.personal_state())
    torch.testing.assert_close(again.model.prompt_vector(), learner.model.prompt_vector())
    assert again.references.keys() == learner.references.keys()
    assert all(torch.equal(again.references[k], learner.references[k]) for k in learner.references)
    assert again.train(2) == learner.train(2)


def test_settings_of_the_other_mode_are_refused_not_ignored(tmp_path) -> None:
    from coordinator.config import CoordinatorConfig
    from coordinator.simulation.federation_config import FederationConfig
    from edge_agent.config import AgentConfig

    agent = {"fleet": "f", "client_id": "a", "state_dir": tmp_path, "data": {"site": "miami"}}
    with pytest.raises(ValueError, match="foundation: not used in mode 'head'"):
        AgentConfig(**agent, foundation=tmp_path / "fm.safetensors")
    with pytest.raises(ValueError, match="dp_sigma"):
        AgentConfig(**agent, dp_sigma=0.1)
    prompt = {"fleet": "f", "state_dir": tmp_path, "mode": "prompt", "foundation": tmp_path / "fm.safetensors"}
    assert CoordinatorConfig(**prompt).strategy == "fedpod"
    assert CoordinatorConfig(**prompt, strategy="fedavg").strategy == "fedavg"
    with pytest.raises(ValueError, match="model: not used in mode 'prompt'"):
        CoordinatorConfig(**prompt, model={"backbone": "gru"})
    with pytest.raises(ValueError, match="needs mode = 'prompt'"):
        CoordinatorConfig(fleet="f", state_dir=tmp_path, strategy="fedpod")
    with pytest.raises(ValueError, match="prompt learners"):
        FederationConfig(strategy="fedpod")
    with pytest.raises(ValueError, match="extra"):
        CoordinatorConfig(**prompt, fedpod={"rounds": 5})  # simulation settings have no place in the service


def test_a_quantile_prompt_model_never_crosses_and_training_lowers_its_pinball_loss(foundation, station) -> None:
    model = PromptedForecaster(foundation, PromptConfig(quantiles=LEVELS), 52.3, 4.8)
    past = station.val[:, :12]
    assert model.full_forecast(past).shape == (len(past), 12, len(FM.variables), 3)
    torch.testing.assert_close(model(past), model.full_forecast(past)[..., 1])  # the point forecast is the median
    untrained = forecast_metrics(prompt_forecasts(model, station.val, station.present), LEVELS)
    terms = train_prompts(model, PromptLoss(levels=LEVELS), station.train, station.present, epochs=3, batch_size=64,
                          lr=1e-2, seed=1)
    assert "pinball" in terms and "mse" not in terms
    trained = forecast_metrics(prompt_forecasts(model, station.val, station.present), LEVELS)
    assert trained.qs < 0.9 * untrained.qs and trained.mse < untrained.mse
    assert trained.icp is not None and trained.mil > 0
    with torch.no_grad():
        model.shared["head"][2].weight.normal_(0.0, 10.0)  # raw outputs of any size and sign
        assert (model.full_forecast(past).diff(dim=-1) >= 0).all()


def test_a_point_config_keeps_its_wire_layout_and_signature(foundation) -> None:
    from edge_agent.learners.prompt import initial_prompt_state, prompt_signature

    point = initial_prompt_state(foundation, PROMPTS, 0)
    assert {k: tuple(v.shape) for k, v in point.items()} == POINT_LAYOUT
    before = {"lookback": 12, "horizon": 12, "task": "multivariate", "target": "temp_air", "spatial": 8}
    expected = signature(point, json.dumps({"prompt": before, "foundation": content_hash(foundation)}))
    assert prompt_signature(PROMPTS, foundation, point) == expected
    quantile = initial_prompt_state(foundation, PROMPTS.model_copy(update={"quantiles": LEVELS}), 0)
    assert {k: tuple(v.shape) for k, v in quantile.items()} == {
        **POINT_LAYOUT, "shared.head.2.weight": (27, 32), "shared.head.2.bias": (27,)}  # V * Q shared outputs
    with pytest.raises(ValueError, match="0.5"):
        PromptConfig(quantiles=(0.1, 0.9))


def test_a_quantile_and_a_point_prompt_agent_cannot_join_one_fleet(foundation, tmp_path) -> None:
    from edge_agent.config import AgentConfig
    from edge_agent.learners import fleet_template, make_learner
    from edge_agent.models.foundation import save_foundation

    digest = save_foundation(foundation, tmp_path / "fm.safetensors")
    agent = {"fleet": "f", "client_id": "a", "state_dir": tmp_path / "a", "data": {"site": "miami"}, "mode": "prompt",
             "foundation": tmp_path / "fm.safetensors", "foundation_sha256": digest, "training": {"stride": 48}}
    point, quantile = (AgentConfig(**agent, prompt=prompt) for prompt in ({}, {"quantiles": list(LEVELS)}))
    signatures = [make_learner(cfg, load_site("miami")).signature for cfg in (point, quantile)]
    assert signatures[0] != signatures[1]
    assert signatures == [fleet_template(cfg, 0).signature for cfg in (point, quantile)]
