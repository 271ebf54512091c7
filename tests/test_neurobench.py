"""Our counts against an outside counter, NeuroBench 2.3.0, on the spiking backbones (the layers
both count: Linear and Conv), on real windows (BatchNorm calibrated, no training) (see export/crosscheck.py)."""

from __future__ import annotations

import pytest

from edge_agent.data import load_site, prepare_client
from export.crosscheck import compare
from tests.conftest import calibrated

pytest.importorskip("neurobench", reason="NeuroBench is installed by `make test` (Makefile target neurobench)")

L = 24  # lookback: the encoder's 1 x 3 convolution has 3 L taps per row, 2 of them on padding


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), L, 12, stride=24)


@pytest.mark.parametrize("kind", ["spikernn", "spikformer", "ispikformer"])
def test_neurobench_counts_agree_where_the_rules_meet(kind: str, site) -> None:
    x, marks, _ = next(iter(site.test.batches(16, shuffle=False)))
    result = compare(calibrated(kind, site), x, marks)
    assert result.neurobench_sparsity == pytest.approx(result.sparsity, abs=1e-12) and 0 < result.sparsity < 1
    layers = {layer.name: layer for layer in result.layers}
    conv = layers.pop("shared.backbone.encoder.conv")
    assert conv.cost == conv.neurobench_cost == "mac"
    assert conv.neurobench_ops == pytest.approx(conv.ops * (3 * L - 2) / (3 * L), rel=1e-12)  # padding
    binary = [layer for layer in layers.values() if layer.max_input <= 1]
    residual = [layer for layer in layers.values() if layer.max_input > 1]
    assert binary and all(layer.cost == "ac" for layer in layers.values())
    for layer in binary:  # binary spikes: the same ACs, exactly
        assert layer.neurobench_cost == "ac" and layer.neurobench_ops == pytest.approx(layer.ops, rel=1e-12), layer
    for layer in residual:  # a 2 is two spikes for us, one "MAC" input for NeuroBench
        assert layer.neurobench_cost == "mac" and layer.neurobench_ops == pytest.approx(layer.nonzero_ops, rel=1e-12)
        assert layer.neurobench_ops < layer.ops
    assert bool(residual) == (kind != "spikernn")  # only Spikformer blocks add spike tensors (x + attn, x + mlp)
    total = sum(layer.neurobench_ops for layer in result.layers)
    assert result.neurobench_macs + result.neurobench_acs == pytest.approx(total, rel=1e-12)
    assert (result.unseen_ops > 0) == (kind != "spikernn")  # spike-spike attention products
