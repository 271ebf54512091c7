"""Model zoo: shapes, the FedPer split, learning, determinism and spiking dynamics."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from edge_agent.data import TIME_FEATURES, load_site, prepare_client, synthetic_table
from edge_agent.models import BACKBONES, ModelConfig, build_forecaster
from edge_agent.models.backbones.spiking import LIF, SpikingSelfAttention
from edge_agent.seeds import derive_seed
from edge_agent.train import calibrate_batchnorm, make_optimizer, seeded_steps, train_epochs
from tests.conftest import small_config

ALL = sorted(BACKBONES)
SNN = [name for name, cls in BACKBONES.items() if cls.kind == "snn"]


@pytest.mark.parametrize("backbone", ALL)
@pytest.mark.parametrize("n_features", [1, 5, 20])
def test_output_shape_for_every_backbone_and_feature_count(backbone: str, n_features: int) -> None:
    cfg = small_config(backbone)
    model = build_forecaster(cfg, n_features, TIME_FEATURES, seed=0)
    x = torch.randn(3, cfg.lookback, n_features)
    marks = torch.rand(3, cfg.lookback, TIME_FEATURES) - 0.5
    out = model(x, marks)
    assert out.shape == (3, cfg.horizon, n_features)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backbone", ["dlinear", "ispikformer"])
def test_linear_projection_variant_has_same_output_shape(backbone: str) -> None:
    cfg = small_config(backbone, projection="linear")
    model = build_forecaster(cfg, 7, TIME_FEATURES, seed=0)
    out = model(torch.randn(2, cfg.lookback, 7), torch.zeros(2, cfg.lookback, TIME_FEATURES))
    assert out.shape == (2, cfg.horizon, 7)
    assert "shared.qap.value.weight" not in model.shared_state()


@pytest.mark.parametrize("backbone", ALL)
def test_shared_part_is_identical_across_feature_counts_and_personal_part_is_not(backbone: str) -> None:
    cfg = small_config(backbone)
    small, large = (build_forecaster(cfg, f, TIME_FEATURES, seed=1) for f in (3, 8))
    shared_small, shared_large = small.shared_state(), large.shared_state()
    assert {k: v.shape for k, v in shared_small.items()} == {k: v.shape for k, v in shared_large.items()}
    assert all(name.startswith("shared.") for name in shared_small)
    for part in ("shared.qap.queries", "shared.qap.value.weight", "shared.time.concat.weight"):
        assert part in shared_small
    personal = small.personal_state()
    assert "personal.slots.weight" in personal and "personal.head.channels.weight" in personal
    assert set(personal) | set(shared_small) == set(small.state_dict())
    assert not set(personal) & set(shared_small)
    full_small, full_large = small.state_dict(), large.state_dict()
    for name in full_small:
        if full_small[name].shape != full_large[name].shape:
            assert name in personal, f"{name} depends on F_i but is not personal"


def test_load_shared_state_moves_parameters_and_rejects_mismatches() -> None:
    cfg = small_config("spikformer")
    a, b = build_forecaster(cfg, 2, TIME_FEATURES, seed=1), build_forecaster(cfg, 6, TIME_FEATURES, seed=2)
    before = b.personal_state()
    b.load_shared_state(a.shared_state())
    for name, tensor in a.shared_state().items():
        assert torch.equal(b.shared_state()[name], tensor)
    for name, tensor in b.personal_state().items():
        assert torch.equal(before[name], tensor)
    state = a.shared_state()
    state.pop("shared.qap.queries")
    with pytest.raises(ValueError, match="missing"):
        b.load_shared_state(state)
    state = a.shared_state()
    state["shared.qap.queries"] = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="shared.qap.queries"):
        b.load_shared_state(state)


def test_qap_is_invariant_to_feature_order_when_slots_move_with_features() -> None:
    cfg = small_config("dlinear", dropout=0.0)
    model = build_forecaster(cfg, 5, TIME_FEATURES, seed=3).eval()
    x = torch.randn(2, cfg.lookback, 5)
    slots = model.personal["slots"].weight.detach()
    perm = torch.tensor([3, 0, 4, 1, 2])
    qap = model.shared["qap"]
    torch.testing.assert_close(qap(x, slots), qap(x[..., perm], slots[perm]), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def client():
    table = synthetic_table(n_features=4, n_steps=600, seed=7)
    return prepare_client(table, lookback=24, horizon=12, stride=2)


@pytest.mark.parametrize("backbone", ALL)
def test_a_few_training_steps_lower_the_loss(backbone: str, client) -> None:
    cfg = small_config(backbone, dropout=0.0)
    model = build_forecaster(cfg, client.n_features, TIME_FEATURES, seed=0)
    optimizer = make_optimizer(model, 3e-3)
    first = train_epochs(model, client.train, 1, 32, optimizer, seed=0)
    train_epochs(model, client.train, 3, 32, optimizer, seed=1)
    last = train_epochs(model, client.train, 1, 32, optimizer, seed=2)
    assert last < 0.9 * first, f"{backbone}: train MSE {first:.4f} -> {last:.4f}"


@pytest.mark.parametrize("backbone", ["itransformer", "spikernn"])
def test_identical_seeds_give_identical_models(backbone: str, client) -> None:
    def trained(seed: int) -> dict[str, torch.Tensor]:
        model = build_forecaster(small_config(backbone), client.n_features, TIME_FEATURES, seed)
        train_epochs(model, client.train, 1, 32, make_optimizer(model, 1e-3), seed)
        return model.state_dict()

    first, second, other = trained(5), trained(5), trained(6)
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], other[k]) for k in first)


def test_make_optimizer_trains_bit_for_bit_as_torch_adam(client) -> None:
    """``make_optimizer``'s Adam (``torch.optim.adam.adam`` without ``torch.optim.Optimizer``,
    whose methods import torch._dynamo) leaves every parameter exactly where
    ``torch.optim.Adam(foreach=True)`` does: over several calls (the moments persist) and with a
    parameter that has no gradient at first (no state until it has one)."""
    def trained(optimizer_of) -> dict[str, torch.Tensor]:
        model = build_forecaster(small_config("dlinear"), client.n_features, TIME_FEATURES, seed=3)
        optimizer = optimizer_of(model)
        frozen = next(model.parameters())
        frozen.requires_grad_(False)
        train_epochs(model, client.train, 1, 32, optimizer, seed=0)
        frozen.requires_grad_(True)
        for seed in (1, 2):
            train_epochs(model, client.train, 1, 32, optimizer, seed)
        return model.state_dict()

    ours = trained(lambda model: make_optimizer(model, 3e-3))
    torchs = trained(lambda model: torch.optim.Adam(model.parameters(), lr=3e-3, foreach=True))
    assert all(torch.equal(ours[k], torchs[k]) for k in torchs)


def test_training_does_not_load_torch_dynamo() -> None:
    """A training process stays 70 MB smaller without torch._dynamo (bench/gateway.py's training
    child), which torch.optim.Optimizer's methods would import."""
    script = ("import sys\n"
              "from edge_agent.data import TIME_FEATURES, prepare_client, synthetic_table\n"
              "from edge_agent.models import ModelConfig, build_forecaster\n"
              "from edge_agent.train import make_optimizer, train_epochs\n"
              "data = prepare_client(synthetic_table(n_features=2, n_steps=300, seed=1), lookback=24, horizon=12)\n"
              "model = build_forecaster(ModelConfig(lookback=24, horizon=12), 2, TIME_FEATURES, seed=0)\n"
              "train_epochs(model, data.train, 1, 32, make_optimizer(model, 1e-3), seed=0)\n"
              "print('torch._dynamo' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False"]


def test_lif_integrates_fires_and_resets_to_zero() -> None:
    lif = LIF()
    current = torch.tensor([0.6, 0.6, 0.6, 0.0, 1.2, 0.3]).reshape(6, 1)
    # membrane: 0.6, 0.9, 1.05 (spike, reset), 0.0, 1.2 (spike, reset), 0.3
    expected = [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert lif(current).flatten().tolist() == expected
    assert lif.step_by_step(current).flatten().tolist() == expected


@pytest.mark.parametrize("threshold", [1.0, 0.5])
def test_fused_lif_matches_snntorch_leaky_in_spikes_and_gradients(threshold: float) -> None:
    torch.manual_seed(0)
    lif = LIF(threshold)
    current = (torch.randn(4, 16, 32) * 1.5).requires_grad_()
    weights = torch.randn(4, 16, 32)
    fused = lif(current)
    (fused * weights).sum().backward()
    fused_grad, current.grad = current.grad.clone(), None
    reference = lif.step_by_step(current)
    (reference * weights).sum().backward()
    assert torch.equal(fused, reference)
    assert 0.05 < fused.mean() < 0.95
    torch.testing.assert_close(fused_grad, current.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backbone", SNN)
def test_spiking_layers_emit_binary_spikes(backbone: str) -> None:
    cfg = small_config(backbone)
    model = build_forecaster(cfg, 3, TIME_FEATURES, seed=0)
    outputs: list[torch.Tensor] = []
    for module in model.modules():
        if isinstance(module, LIF):
            module.register_forward_hook(lambda _m, _i, out: outputs.append(out))
    model(torch.randn(4, cfg.lookback, 3) * 3, torch.zeros(4, cfg.lookback, TIME_FEATURES))
    assert outputs
    for spikes in outputs:
        assert spikes.shape[0] == cfg.steps
        assert set(spikes.unique().tolist()) <= {0.0, 1.0}
    assert 0.0 < torch.cat([s.flatten() for s in outputs]).mean() < 1.0


def test_unknown_backbone_is_rejected_with_the_valid_names() -> None:
    with pytest.raises(ValueError, match="dlinear"):
        ModelConfig(backbone="transformer-xl")


def test_seeded_steps_with_replacement_draws_full_batches_reproducibly() -> None:
    """With ``replacement`` an epoch is ceil(size / batch) batches of exactly ``batch_size`` indices,
    repeats allowed (FeDaL's core-set tuning draws so from a pool smaller than a few batches), the
    same draws for the same seed and ``max_steps`` ending the run mid-epoch."""
    def drawn(seed: int, max_steps: int = 0) -> list[list[int]]:
        weight = torch.zeros(1, requires_grad=True)
        picks = []

        def step_loss(batch: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
            picks.append(batch.tolist())
            return weight.sum() * 0.0

        seeded_steps(make_optimizer(torch.nn.Linear(1, 1), 1e-3), 10, 3, 4, seed, step_loss, max_steps,
                     replacement=True)
        return picks

    picks = drawn(5)
    assert len(picks) == 3 * 3 and all(len(batch) == 4 and all(0 <= i < 10 for i in batch) for batch in picks)
    first_epoch = sum(picks[:3], [])
    assert len(set(first_epoch)) < len(first_epoch)  # 12 draws from 10: an epoch repeats, unlike a shuffle
    assert drawn(5) == picks and drawn(6) != picks and drawn(5, max_steps=4) == picks[:4]


def test_derive_seed_is_stable_and_mixes() -> None:
    assert derive_seed(1, 2) == derive_seed(1, 2)
    assert derive_seed(1, 2) != derive_seed(2, 1)


def test_batchnorm_calibration_wakes_a_briefly_trained_spiking_model() -> None:
    data = prepare_client(load_site("miami"), 24, 12, stride=24)
    model = build_forecaster(small_config("spikernn"), data.n_features, 4, seed=1).eval()
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    x, marks, _ = data.test.batch(torch.arange(16))

    def rate() -> float:
        spikes = []
        hooks = [m.register_forward_hook(lambda _m, _a, out: spikes.append(out.mean())) for m in model.modules()
                 if isinstance(m, LIF)]
        with torch.no_grad():
            model(x, marks)
        for hook in hooks:
            hook.remove()
        return float(torch.stack(spikes).mean())

    before = rate()
    calibrate_batchnorm(model, data.train)
    assert not model.training and rate() > max(before, 0.01)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())  # only statistics changed


@pytest.mark.parametrize("tokens", [4, 128])
@pytest.mark.parametrize("rate", [0.05, 0.3])
def test_the_attention_lif_fires_whatever_the_token_count_and_input_rate(tokens: int, rate: float) -> None:
    """Q K^T V grows with N and with the cube of the Q/K/V rates; normalized before the attention
    LIF, the LIF fires at a similar rate for 4 channel tokens at 5% and for 128 tokens at 30%
    (Spikformer's fixed 0.125 scale left 4 sparse tokens silent: bench/firing.py at 5abc4cb)."""
    torch.manual_seed(5)
    attention = SpikingSelfAttention(dim=32, heads=4)
    rates = []
    attention.attn_lif.register_forward_hook(lambda _m, _a, out: rates.append(float(out.mean())))
    x = (torch.rand(4, 16, tokens, 32) < rate).float()  # (T, B, N, D) spikes
    with torch.no_grad():
        attention(x)
        q, k, v = (attention.split(proj(x)) for proj in (attention.q, attention.k, attention.v))
        scaled = (q @ k.transpose(-2, -1) * 0.125 @ v).transpose(-3, -2).flatten(-2)
    assert 0.05 < rates[0] < 0.5, rates
    if tokens == 4 and rate == 0.05:
        assert float(attention.attn_lif(scaled).mean()) < 0.01  # the fixed scale: silent
