"""Operation counts against hand counts, and on every backbone with real data."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edge_agent.data import load_site, prepare_client
from edge_agent.models import BACKBONES, build_forecaster
from edge_agent.models.backbones.spiking import LIF, SpikingSelfAttention
from export.energy import energy_report
from export.opcount import count_ops, measure
from export.profiles import load_profile
from tests.conftest import small_config, trained


def by_name(layers) -> dict:
    return {layer.name: layer for layer in layers}


def test_linear_on_real_values_costs_every_mac() -> None:
    net = nn.Sequential(nn.Linear(4, 3))
    layers = by_name(measure(net, lambda: net(torch.randn(2, 5, 4))))
    assert layers["0"].macs == 2 * 5 * 4 * 3 and layers["0"].acs == 0


class SpikeFed(nn.Module):
    """Two LIF layers whose spikes, summed, feed a Linear (a residual sum of spike tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.linear = LIF(), LIF(), nn.Linear(6, 2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.linear(self.a(a) + self.b(b))


def test_linear_on_spikes_costs_one_ac_per_spike_and_fan_out() -> None:
    net = SpikeFed()
    spikes = torch.zeros(60)
    spikes[torch.randperm(60, generator=torch.Generator().manual_seed(0))[:17]] = 1
    currents = 2 * spikes.reshape(1, 10, 6)  # one step: a current of 2 crosses the threshold of 1
    layers = by_name(measure(net, lambda: net(currents, torch.zeros_like(currents))))
    assert layers["linear"].cost == "ac" and layers["linear"].acs == 17 * 2 and layers["linear"].macs == 0
    assert layers["linear"].input_rate == pytest.approx(17 / 60)
    both = torch.tensor([[[0.0, 2.0, 2.0, 0.0, 2.0, 0.0]]])
    layers = by_name(measure(net, lambda: net(both, both * torch.tensor([0.0, 1, 0, 0, 1, 0]))))
    assert layers["linear"].acs == (0 + 2 + 1 + 0 + 2 + 0) * 2  # a 2 is two spikes arriving together


@pytest.mark.parametrize("fill", [0.0, 1.0])
def test_a_layer_costs_by_what_feeds_it_not_by_its_values(fill: float) -> None:
    """All-zero and all-one inputs (which look like spikes) leave every layer's kind as the
    structure says: the Linear fed the raw input multiplies, the one fed a LIF accumulates."""
    net = nn.Sequential(nn.Linear(6, 6), LIF(), nn.Linear(6, 2), LIF(), nn.Linear(2, 3))
    net[4].register_forward_pre_hook(lambda module, args: (args[0].mean(0),))  # a rate: real values
    layers = by_name(measure(net, lambda: net(torch.full((3, 5, 6), fill))))
    assert {name: layer.cost for name, layer in layers.items()} == {
        "0": "mac", "1": "neuron_update", "2": "ac", "3": "neuron_update", "4": "mac"}
    assert layers["0"].macs == 3 * 5 * 6 * 6 and layers["4"].macs == 5 * 2 * 3


def test_rates_over_two_batches_equal_the_rate_over_their_concatenation() -> None:
    net = nn.Sequential(LIF(), nn.Linear(4, 3), LIF())
    torch.manual_seed(2)
    first, second = 2 * torch.rand(5, 7, 4), 3 * torch.rand(5, 2, 4)  # different batch sizes and rates

    def run_both() -> None:
        net(first)
        net(second)

    split = by_name(measure(net, run_both))
    joined = by_name(measure(net, lambda: net(torch.cat([first, second], dim=1))))
    for name in ("0", "1", "2"):
        for field in ("acs", "neuron_updates", "firing_rate", "input_rate"):
            assert getattr(split[name], field) == pytest.approx(getattr(joined[name], field)), (name, field)
    assert split["0"].firing_rate != pytest.approx(by_name(measure(net, lambda: net(second)))["0"].firing_rate)


def test_one_spiking_attention_block_matches_a_loop_count() -> None:
    torch.manual_seed(4)
    block = SpikingSelfAttention(dim=8, heads=2).eval()
    for linear in (block.q.linear, block.k.linear, block.v.linear, block.out.linear):
        nn.init.uniform_(linear.weight, -0.2, 0.6)
    x = (torch.rand(3, 2, 5, 8) < 0.4).float()  # (T, B, N, D) spikes
    net = nn.Sequential(LIF(), block)  # the block is fed a LIF's spikes: a current of 2 spikes at once
    layers = {name.removeprefix("1."): layer for name, layer in by_name(measure(net, lambda: net(2 * x))).items()}
    with torch.no_grad():
        q, k, v = (block.split(proj(x)) for proj in (block.q, block.k, block.v))
        mixed = (q @ k.transpose(-2, -1) @ v).transpose(-3, -2).flatten(-2)
        attn_spikes = block.attn_lif(block.norm(mixed.flatten(0, -2)).reshape(mixed.shape))
    qk = av = 0
    for t in range(3):
        for b in range(2):
            for h in range(2):
                for i in range(5):
                    for j in range(5):
                        qk += int(sum(q[t, b, h, i, d] * k[t, b, h, j, d] for d in range(4)))
                        av += int(sum(v[t, b, h, j, e] for e in range(4)))
    assert qk > 0 and av > 0
    assert layers["1"].acs == qk + av
    assert layers["1"].macs == 3 * 2 * 5 * 8  # the BatchNorm of Q K^T V: one multiply-add per (T, B, i, d)
    for name in ("q.linear", "k.linear", "v.linear"):
        assert layers[name].acs == x.sum() * 8 and layers[name].macs == 0
    assert layers["out.linear"].acs == attn_spikes.sum() * 8
    for name in ("q.lif", "k.lif", "v.lif", "attn_lif", "out.lif"):
        assert layers[name].neuron_updates == 3 * 2 * 5 * 8
    total = sum(layer.acs for name, layer in layers.items() if name != "0")
    assert total == qk + av + 3 * x.sum() * 8 + attn_spikes.sum() * 8


def test_the_seasonal_base_costs_one_mac_per_season_and_forecast_value(site) -> None:
    model = build_forecaster(small_config("dlinear", seasonal_base=True, season=6), site.n_features, 4, seed=1)
    layers = by_name(count_ops(model, site.test)[0])
    seasons = 24 // 6  # lookback 24, season 6
    assert layers["shared.base"].macs == len(site.test) * 12 * site.n_features * seasons
    assert layers["shared.base"].stage == "head"


def test_a_module_without_a_counting_rule_is_refused() -> None:
    net = nn.Sequential(nn.Linear(3, 3), nn.Bilinear(3, 3, 2))
    with pytest.raises(NotImplementedError, match="1: no operation-count rule for Bilinear"):
        measure(net, lambda: None)


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_every_backbone_is_counted_on_real_windows(backbone: str, site) -> None:
    layers, windows = count_ops(trained(backbone, site), site.test)
    assert windows == len(site.test)
    stages = {layer.stage for layer in layers}
    assert stages == {"pre-backbone", "backbone", "head"}
    backbone_layers = [layer for layer in layers if layer.stage == "backbone"]
    if BACKBONES[backbone].kind == "snn":
        assert sum(layer.acs for layer in backbone_layers) > 0
        attention = [f"shared.backbone.blocks.{i}.attn" for i in range(2)] if "spikformer" in backbone else []
        # real-valued work: the encoder's conv, and the normalization of each spiking attention's Q K^T V
        assert [layer.name for layer in backbone_layers if layer.macs] == ["shared.backbone.encoder.conv", *attention]
        rates = [layer.firing_rate for layer in layers if layer.firing_rate is not None]
        assert rates and all(0.0 <= rate <= 1.0 for rate in rates)
    else:
        assert all(layer.acs == 0 for layer in layers)
        assert sum(layer.macs for layer in backbone_layers) > 0


def test_a_quantile_head_costs_its_extra_outputs_and_the_monotone_transform(site) -> None:
    """Q levels: the channel read-out has Q times the point head's outputs and the non-crossing
    transform 2 (Q - 1) operations per forecast value; the rest of the model costs the same."""
    def costs(levels: tuple[float, ...] | None) -> tuple[float, float, float]:
        """Per window: the head's MACs and pJ, and the MACs of everything before it."""
        model = build_forecaster(small_config("dlinear", quantiles=levels), site.n_features, 4, seed=3)
        layers, windows = count_ops(model, site.test)
        report = energy_report(layers, windows, load_profile("cmos45nm"))
        rest = sum(layer.macs for layer in layers if layer.stage != "head") / windows
        return report.stages["head"].macs, report.stages["head"].pj, rest

    point, three, five = costs(None), costs((0.1, 0.5, 0.9)), costs((0.05, 0.25, 0.5, 0.75, 0.95))
    width = build_forecaster(small_config("dlinear"), site.n_features, 4, seed=3).personal["head"].channels.in_features
    per_level = 12 * site.n_features * (width + 2)  # per window: H F (C read-out MACs + 2 transform ops)
    assert three[0] - point[0] == pytest.approx(2 * per_level) and five[0] - point[0] == pytest.approx(4 * per_level)
    profile = load_profile("cmos45nm")
    mac_pj = profile.cost("mac", profile.default_precision).pj
    assert three[1] - point[1] == pytest.approx(2 * per_level * mac_pj)
    assert point[2] == three[2] == five[2]


@pytest.mark.parametrize("fill", [0.0, 1.0])
def test_a_spikernn_head_multiplies_its_rates_even_when_they_look_like_spikes(fill: float, site) -> None:
    """The head's time layer reads the mean rate over T (real values): by hand, channels x
    lookback x horizon MACs per window (16 x 24 x 12 here), also when every rate it gets is 0 or 1."""
    model = build_forecaster(small_config("spikernn"), site.n_features, 4, seed=3).eval()
    x, marks, _ = next(iter(site.test.batches(8, shuffle=False)))
    model.personal["head"].time.register_forward_pre_hook(lambda module, args: (torch.full_like(args[0], fill),))
    layers = by_name(measure(model, lambda: model(torch.full_like(x, fill), marks)))
    head = layers["personal.head.time"]
    assert head.cost == "mac" and head.acs == 0 and head.macs / len(x) == 16 * 24 * 12
    assert layers["shared.backbone.stack.0.linear"].cost == "ac" and layers["shared.backbone.encoder.conv"].cost == "mac"
    assert {name for name, layer in layers.items() if layer.cost == "ac"} == {
        f"shared.backbone.stack.{index}.linear" for index in range(3)}
