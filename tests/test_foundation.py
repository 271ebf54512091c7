"""FedPoD's foundation model: geometric masks, masked loss, federated pretraining, content hash."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, safe_open, save

from coordinator.simulation.pretrain import pretrain
from coordinator.simulation.pretrain_config import PretrainConfig
from edge_agent.learners.foundation import reconstruction_loss
from edge_agent.data.canonical import device_series
from edge_agent.data import load_sites
from edge_agent.models.foundation import (
    FoundationError,
    FoundationModel,
    content_hash,
    geometric_mask,
    load_foundation,
    masked_mse,
    save_foundation,
)
from edge_agent.models.foundation_config import FoundationConfig

SMALL = FoundationConfig(window=12, d_model=16, heads=2, layers=1, d_ff=32, dropout=0.0)


def runs(column: np.ndarray) -> list[int]:
    """Lengths of the masked runs in one column."""
    lengths, current = [], 0
    for value in column:
        if value:
            current += 1
        elif current:
            lengths.append(current)
            current = 0
    return lengths + ([current] if current else [])


def test_geometric_masks_hit_the_rate_and_mean_length_per_variable() -> None:
    mask = geometric_mask(200_000, 3, rate=0.15, mean_masked=3.0, rng=np.random.default_rng(0))
    assert mask.mean() == pytest.approx(0.15, abs=0.01)
    for v in range(3):
        assert np.mean(runs(mask[:, v])) == pytest.approx(3.0, abs=0.1)
    assert not np.array_equal(mask[:, 0], mask[:, 1])  # variables are masked independently


def test_masked_loss_counts_only_masked_positions_of_measured_variables() -> None:
    target = torch.zeros(1, 3, 2)
    recon = torch.tensor([[[1.0, 5.0], [2.0, 5.0], [3.0, 5.0]]])
    masked = torch.tensor([[[True, True], [False, True], [True, False]]])
    present = torch.tensor([True, False])  # variable 1 is not measured at this station
    assert float(masked_mse(recon, target, masked, present)) == pytest.approx((1 + 9) / 2)
    recon[0, 1, 0] = 100.0  # an unmasked position
    recon[0, 0, 1] = 100.0  # a masked position of an unmeasured variable
    assert float(masked_mse(recon, target, masked, present)) == pytest.approx(5.0)


@pytest.fixture(scope="module")
def devices():
    return [device_series(t, SMALL.variables, SMALL.window, stride=24) for t in load_sites()]


def test_unmeasured_variables_are_zero_and_flagged(devices) -> None:
    burlington = next(d for d in devices if d.name == "burlington")
    absent = ~burlington.present
    assert absent.any() and burlington.train[..., absent].abs().sum() == 0
    assert burlington.train.shape[1:] == (12, len(SMALL.variables))


def test_federated_pretraining_learns_to_reconstruct_real_weather(devices) -> None:
    cfg = PretrainConfig(rounds=4, local_epochs=1, participation=0.5, batch_size=32, lr=3e-3, stride=24, seed=1)
    initial = FoundationModel(SMALL)
    before = np.mean([reconstruction_loss(initial, d, d.val, cfg.seed) for d in devices])
    model, records = pretrain(devices, SMALL, cfg)
    assert [len(r.devices) for r in records] == [4] * 4  # ceil(0.5 x 7)
    assert len({r.devices for r in records}) > 1  # a different sample of devices per round
    assert records[-1].val_loss < 0.8 * before and records[-1].val_loss < records[0].val_loss
    again, _ = pretrain(devices, SMALL, cfg)
    assert content_hash(again) == content_hash(model)  # seeded


def test_checkpoint_hash_is_checked(tmp_path) -> None:
    model = FoundationModel(SMALL)
    digest = save_foundation(model, tmp_path / "fm.safetensors")
    assert content_hash(load_foundation(tmp_path / "fm.safetensors", expected_hash=digest)) == digest
    with pytest.raises(FoundationError, match="differs from the coordinator's"):
        load_foundation(tmp_path / "fm.safetensors", expected_hash="0" * 64)
    other = FoundationModel(SMALL)
    with torch.no_grad():
        other.reconstruct.bias.add_(1.0)
    with safe_open(str(tmp_path / "fm.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    (tmp_path / "forged.safetensors").write_bytes(save(other.state_dict(), metadata=metadata))
    with pytest.raises(FoundationError, match="the file claims"):
        load_foundation(tmp_path / "forged.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"junk")
    with pytest.raises(FoundationError, match="junk.safetensors"):
        load_foundation(tmp_path / "junk.safetensors")
    assert load_file(str(tmp_path / "fm.safetensors")).keys() == model.state_dict().keys()
