"""Every backbone kind, small, untrained, BatchNorm statistics from real windows: its MACs and ACs counted by hand from the layer
shapes (and, for spike-fed layers, the spikes that reach them) equal the counter's."""

from __future__ import annotations

import pytest
import torch

from edge_agent.data import load_site, prepare_client
from edge_agent.models import BACKBONES
from export.opcount import measure
from tests.conftest import calibrated

WINDOWS = 16
SIZES = dict(lookback=24, horizon=12, d_qap=16, hidden=16, d_ff=32, steps=4)  # tests/conftest.small_config
LAYERS = 2  # every backbone's default depth, which small_config keeps
B, L, H, C, D, F, T = WINDOWS, 24, 12, 16, 16, 32, 4  # windows, lookback, horizon, d_qap, hidden, d_ff, steps


def dlinear(backbone, z) -> tuple[float, float]:
    """Per channel: the moving average (k = 25 MACs per value) and the seasonal and trend maps L -> H."""
    return B * C * (L * 25 + 2 * L * H), 0


def itransformer(backbone, z) -> tuple[float, float]:
    """C tokens: the embedding L -> D, then per layer the Q/K/V/out projections (4 C D^2),
    QK^T and attention x V (2 C^2 D) and the feed-forward D -> F -> D (2 C D F)."""
    return B * C * L * D + LAYERS * B * (4 * C * D * D + 2 * C * C * D + 2 * C * D * F), 0


def recurrent(gates: int):
    """Per step: every gate reads input and hidden state, (width + D) x D MACs; the first layer's
    width is C, the next one's D."""
    def count(backbone, z) -> tuple[float, float]:
        return B * L * gates * ((C + D) * D + (D + D) * D), 0
    return count


def encoder(backbone, z) -> tuple[float, torch.Tensor]:
    """The conv encoder: T maps, a 1 x 3 kernel over time on one input map, MACs on every output
    (B, T, C, L), padding included; returns its spikes (T, B, L, C)."""
    return B * T * C * L * 3, backbone.encoder(z)


def spikernn(backbone, z) -> tuple[float, float]:
    """Each Linear of the stack: one AC per arriving spike and fan-out (D outputs)."""
    macs, x = encoder(backbone, z)
    acs = 0.0
    for block in backbone.stack:
        acs += float(x.sum()) * D
        x = block(x)
    return macs, acs


def spiking_blocks(blocks, x: torch.Tensor) -> tuple[float, float]:
    """Spikformer blocks on spike counts x (T, B, N, D): q/k/v read x (3 x spikes x D); QK^T one AC
    per co-active query/key bit, attention x V each value spike once per query row (N), the
    BatchNorm of the result one multiply-add per value (N x D); the out projection reads the
    attention LIF's spikes; the MLP reads x + attn (D -> F -> D)."""
    macs, acs = 0.0, 0.0
    for block in blocks:
        attn, tokens = block.attn, x.shape[-2]
        q, k, v = (attn.split(proj(x)) for proj in (attn.q, attn.k, attn.v))
        scores = (q @ k.transpose(-2, -1) @ v).transpose(-3, -2).flatten(-2)
        mixed = attn.attn_lif(attn.norm(scores.flatten(0, -2)).reshape(scores.shape))
        macs += x.shape[0] * x.shape[1] * tokens * D
        acs += 3 * float(x.sum()) * D + float((q @ k.transpose(-2, -1)).sum()) + float(v.sum()) * tokens
        acs += float(mixed.sum()) * D
        x = x + attn.out(mixed)
        hidden = block.mlp[0](x)
        acs += float(x.sum()) * F + float(hidden.sum()) * D
        x = x + block.mlp[1](hidden)
    return macs, acs


def spikformer(backbone, z) -> tuple[float, float]:
    """Tokens are the L positions: the embedding C -> D reads the encoder's spikes."""
    macs, x = encoder(backbone, z)
    block_macs, block_acs = spiking_blocks(backbone.blocks, backbone.embed(x))
    return macs + block_macs, float(x.sum()) * D + block_acs


def ispikformer(backbone, z) -> tuple[float, float]:
    """Tokens are the C channels: the embedding L -> D reads each channel's spike train."""
    macs, x = encoder(backbone, z)
    x = x.transpose(-2, -1)
    block_macs, block_acs = spiking_blocks(backbone.blocks, backbone.embed(x))
    return macs + block_macs, float(x.sum()) * D + block_acs


BY_HAND = {"dlinear": dlinear, "itransformer": itransformer, "lstm": recurrent(4), "gru": recurrent(3),
           "spikernn": spikernn, "spikformer": spikformer, "ispikformer": ispikformer}


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), SIZES["lookback"], SIZES["horizon"], stride=24)


def test_every_registered_backbone_has_a_hand_count() -> None:
    assert set(BY_HAND) == set(BACKBONES)


@pytest.mark.parametrize("kind", sorted(BY_HAND))
def test_backbone_ops_equal_the_hand_count(kind: str, site) -> None:
    model = calibrated(kind, site)
    x, marks, _ = next(iter(site.test.batches(WINDOWS, shuffle=False)))
    seen: list[torch.Tensor] = []
    hook = model.shared["backbone"].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    try:
        layers = measure(model, lambda: model(x, marks))
    finally:
        hook.remove()
    backbone = [layer for layer in layers if layer.stage == "backbone"]
    with torch.no_grad():
        macs, acs = BY_HAND[kind](model.shared["backbone"], seen[0])
    assert sum(layer.macs for layer in backbone) == macs
    assert sum(layer.acs for layer in backbone) == pytest.approx(acs, rel=1e-12)
    assert (acs > 0) == (BACKBONES[kind].kind == "snn")
