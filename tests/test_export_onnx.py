"""ONNX export of every backbone, verified in ONNX Runtime on real weather windows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from edge_agent.data import load_site, prepare_client
from edge_agent.models import BACKBONES, CheckpointError, build_forecaster, load_checkpoint, save_checkpoint
from export.contract import ExportMismatchError
from edge_agent.onnx_model import OnnxForecaster
from export.onnx import compare, export_onnx, run_session, stream, verify
from tests.conftest import small_config, trained

LEVELS = (0.1, 0.5, 0.9)


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


@pytest.mark.parametrize("backbone", sorted(BACKBONES))
def test_every_backbone_exports_and_onnx_runtime_reproduces_it(backbone: str, site, tmp_path: Path) -> None:
    model = trained(backbone, site)
    report = export_onnx(model, tmp_path, site.test, n_windows=32)
    assert report.format == "onnx" and report.windows == 32 and report.max_abs_error <= 1e-5
    if BACKBONES[backbone].kind == "snn":
        assert report.files == [str(tmp_path / f"{name}.onnx") for name in ("model", "encode", "step", "readout")]
        assert report.details["spikes_checked"] > 0 and report.details["stream_max_abs_error"] <= 1e-5
        assert report.spike_agreement >= 0.999 and report.details["flipped_windows"] <= max(1, report.windows // 20)
        x, marks, _ = site.test.batch(torch.arange(8))
        forecast, spikes = stream(tmp_path, x.numpy(), marks.numpy())
        assert 0.0 < spikes.mean() < 1.0  # a spiking transformer's block output sums residual spikes:
        assert spikes.min() >= 0 and np.array_equal(spikes, np.round(spikes))  # counts, not only 0 / 1
        torch.testing.assert_close(torch.from_numpy(forecast), model(x, marks).detach(), atol=1e-5, rtol=0)
    else:
        assert report.spike_agreement is None and report.files == [str(tmp_path / "model.onnx")]
        assert report.steps is None and report.details == {}


def test_a_model_that_onnx_cannot_reproduce_is_refused(site, tmp_path: Path) -> None:
    model = trained("dlinear", site)
    export_onnx(model, tmp_path, site.test, n_windows=8)
    x, marks, _ = site.test.batch(torch.arange(8))
    with torch.no_grad():
        expected = model(x, marks) + 1e-3  # what a broken export would be compared against
    with pytest.raises(ExportMismatchError, match="differs from torch"):
        compare((expected,), run_session(tmp_path / "model.onnx", {"x": x.numpy(), "marks": marks.numpy()}), 1e-5, "x")


def test_checkpoint_round_trip_and_bad_files_name_the_reason(site, tmp_path: Path) -> None:
    model = trained("spikernn", site)
    path = tmp_path / "m.safetensors"
    save_checkpoint(model, path, list(site.columns))
    again, columns = load_checkpoint(path)
    assert columns == list(site.columns)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cut.safetensors.*not a readable safetensors"):
        load_checkpoint(tmp_path / "cut.safetensors")
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "none.safetensors")
    broken = build_forecaster(small_config("spikernn"), site.n_features, 4, seed=1)
    with torch.no_grad():
        next(broken.parameters()).fill_(float("nan"))
    save_checkpoint(broken, tmp_path / "nan.safetensors")
    with pytest.raises(CheckpointError, match="NaN"):
        load_checkpoint(tmp_path / "nan.safetensors")


def test_export_command_on_a_checkpoint_and_the_agent_forecasts_with_onnx(site, tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_checkpoint(trained("spikernn", site), path, list(site.columns))
    run = [sys.executable, "-m", "edgefl.cli", "export", "onnx", "--checkpoint", str(path)]
    proc = subprocess.run([*run, "--site", "amsterdam", "--out", str(tmp_path / "onnx")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "% identical" in proc.stdout and (tmp_path / "onnx" / "step.onnx").is_file()
    proc = subprocess.run([*run, "--site", "burlington", "--out", str(tmp_path / "x")], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "burlington" in proc.stderr and "Traceback" not in proc.stdout + proc.stderr


def test_the_agent_forecasts_with_the_exported_model(site, tmp_path: Path) -> None:
    model = trained("itransformer", site)
    export_onnx(model, tmp_path, site.test, n_windows=8)
    x, marks, _ = site.test.batch(torch.arange(3))
    got = OnnxForecaster(tmp_path / "model.onnx", None, 12)(x, marks)
    torch.testing.assert_close(got, model(x, marks).detach(), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="expects"):
        OnnxForecaster(tmp_path / "model.onnx", None, 12)(x[:, :, :2], marks)
    with pytest.raises(ValueError, match=r"forecasts point values, this agent's config quantiles \(0.1, 0.5, 0.9\)"):
        OnnxForecaster(tmp_path / "model.onnx", LEVELS, 12)
    with pytest.raises(ValueError, match=r"has shape \['batch', 12, \d+\], this agent's config forecasts 24 steps of point"):
        OnnxForecaster(tmp_path / "model.onnx", None, 24)
    graph = onnx.load(tmp_path / "model.onnx")
    onnx.helper.set_model_props(graph, {"quantiles": "low,high"})
    onnx.save(graph, tmp_path / "odd.onnx")
    with pytest.raises(ValueError, match="odd.onnx: metadata quantiles='low,high' is not a list of levels"):
        OnnxForecaster(tmp_path / "odd.onnx", LEVELS, 12)
    (tmp_path / "junk.onnx").write_bytes(b"junk")
    with pytest.raises(ValueError, match="junk.onnx"):
        OnnxForecaster(tmp_path / "junk.onnx", None, 12)


@pytest.mark.parametrize("backbone", ["dlinear", "spikernn"])
def test_a_quantile_model_exports_every_level_and_onnx_runtime_reproduces_them(backbone: str, site,
                                                                               tmp_path: Path) -> None:
    model = trained(backbone, site, steps=10, quantiles=LEVELS)
    report = export_onnx(model, tmp_path, site.test, n_windows=16)
    assert report.max_abs_error <= 1e-5 and any("(batch, H, F, 3)" in note for note in report.notes)
    x, marks, _ = site.test.batch(torch.arange(5))
    expected = model.forward_quantiles(x, marks).detach()
    graph = run_session(tmp_path / "model.onnx", {"x": x.numpy(), "marks": marks.numpy()})[0]
    assert graph.shape == (5, 12, site.n_features, 3)
    torch.testing.assert_close(torch.from_numpy(graph), expected, atol=1e-5, rtol=0)
    served = OnnxForecaster(tmp_path / "model.onnx", LEVELS, 12)
    torch.testing.assert_close(served(x, marks), model(x, marks).detach(), atol=1e-5, rtol=0)  # the median
    with pytest.raises(ValueError, match=r"forecasts quantiles \(0.1, 0.5, 0.9\), this agent's config point values"):
        OnnxForecaster(tmp_path / "model.onnx", None, 12)
    with pytest.raises(ValueError, match=r"this agent's config quantiles \(0.05, 0.5, 0.95\)"):
        OnnxForecaster(tmp_path / "model.onnx", (0.05, 0.5, 0.95), 12)
    if BACKBONES[backbone].kind == "snn":  # the streaming read-out gives every level too
        forecast, _ = stream(tmp_path, x.numpy(), marks.numpy())
        torch.testing.assert_close(torch.from_numpy(forecast), expected, atol=1e-5, rtol=0)


def test_spike_flips_are_counted_and_bounded() -> None:
    spikes = (np.arange(4 * 6 * 5).reshape(4, 6, 5) % 3 == 0).astype(np.float32)  # (T, B, N)
    forecast = np.linspace(0, 1, 6 * 2).reshape(6, 2).astype(np.float32)
    flipped, shifted = spikes.copy(), forecast.copy()
    flipped[2, 4, 1] = 1 - flipped[2, 4, 1]  # one spike of window 4 flips, so its forecast may move
    shifted[4] += 0.5
    error, agreement, windows = verify((forecast, spikes), (shifted, flipped), 1e-5, 0.05, "test")
    assert error == 0.0 and agreement == pytest.approx(1 - 1 / spikes.size) and windows == 1
    travelled = flipped.copy()
    travelled[3:, 4] = 1 - travelled[3:, 4]  # the flip travels on through the window's later steps: still one window
    assert verify((forecast, spikes), (shifted, travelled), 1e-5, 0.05, "test")[2] == 1
    flipped[0, 2, 0] = 1 - flipped[0, 2, 0]  # a second window flips: more than 5% of 6 windows (one allowed)
    with pytest.raises(ExportMismatchError, match="2 of 6 windows have spikes that differ"):
        verify((forecast, spikes), (shifted, flipped), 1e-5, 0.05, "test")
    assert verify((forecast, spikes), (shifted, flipped), 1e-5, 0.5, "test")[2] == 2
    shifted[0] += 1e-3  # a window with identical spikes must still match
    with pytest.raises(ExportMismatchError, match="differs from torch"):
        verify((forecast, spikes), (shifted, flipped), 1e-5, 0.5, "test")
