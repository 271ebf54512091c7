"""The export matrix (``export.matrix``): every backbone x projection x head x point/quantile
forecasts, tiny, exported to ONNX and run in ONNX Runtime at batch 1, 7 and 32 against torch on
real weather windows (a spiking backbone's on-chip stack also to NIR and Lava netx); the combinations the config refuses are refused in one line; no exported
graph keeps a shape of its export batch, and the serving path refuses one that does."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch import nn

from edge_agent.data import ClientData
from edge_agent.models import BACKBONES, save_checkpoint
from edge_agent.onnx_model import OnnxForecaster
from edge_agent.serving.onnx_serving import INFO_FILE, MODEL_FILE, BundleInfo, OnnxServing
from export.bundle import export_module
from export.contract import ExportMismatchError
from export.matrix import EXPORT_WINDOWS, TINY, Cell, baked_shapes, build, cells, check, matrix_data
from export.onnx import TOLERANCE, _export, export_onnx, run_session

EXPORTED = [cell for cell in cells() if cell.refusal() is None]
REFUSED = [cell for cell in cells() if cell.refusal() is not None]


def name(cell: Cell) -> str:
    return f"{cell.backbone}-{cell.projection}-{cell.head}-{'quantiles' if cell.quantiles else 'point'}"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second torch thread, and lose much when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data() -> ClientData:
    return matrix_data()


@pytest.fixture(scope="module")
def checked(data: ClientData, tmp_path_factory: pytest.TempPathFactory) -> Callable[[Cell], dict[str, Any]]:
    """``export.matrix.check`` of a cell, once per cell for every test below."""
    return functools.cache(lambda cell: check(cell, data, tmp_path_factory.mktemp(name(cell))))


@pytest.mark.parametrize("cell", EXPORTED, ids=name)
def test_every_cell_exports_and_matches_torch_at_batch_1_7_and_32(cell: Cell, checked) -> None:
    row = checked(cell)
    assert row["exported"], row.get("reason")
    assert row["batch_sizes_ok"] and row["max_abs_diff"] <= TOLERANCE, row
    if BACKBONES[cell.backbone].kind == "snn":
        assert row["spikes_identical"] is True and 0.0 < row["firing_rate"] < 1.0, row  # spikes were compared
        formats = row["neuromorphic"]  # the on-chip stack to NIR and Lava netx: exported, or why not in one line
        assert set(formats) == {"nir", "lava"} and all(v == "exported" or "\n" not in v for v in formats.values())
        if cell.backbone == "spikernn":
            assert formats == {"nir": "exported", "lava": "exported"}, formats
    else:
        assert row["spikes_identical"] is None and "neuromorphic" not in row


@pytest.mark.parametrize("cell", EXPORTED, ids=name)
def test_no_exported_graph_keeps_a_shape_of_its_export_batch(cell: Cell, checked) -> None:
    assert checked(cell)["baked"] == []


@pytest.mark.parametrize("cell", REFUSED, ids=name)
def test_a_refused_cell_says_why_in_one_line(cell: Cell, checked) -> None:
    with pytest.raises(ValidationError):
        cell.config()
    row = checked(cell)
    assert not row["exported"] and "\n" not in row["reason"]
    assert row["reason"] == f"head = 'shared' needs projection = 'channel' (a {cell.projection} head is shaped by " \
                            "each gateway's feature count)"


class KeepsItsBatch(nn.Module):
    """A forecaster-shaped module whose traced graph keeps its export batch: ``len(x)`` is a
    Python number when traced, so the ones it makes are a constant of that many rows."""

    def forward(self, x: torch.Tensor, marks: torch.Tensor) -> torch.Tensor:
        return x[:, -TINY["horizon"]:] * torch.ones(len(x), 1, 1)


def test_a_graph_that_keeps_its_export_batch_is_found_refused_and_not_served(data: ClientData,
                                                                              tmp_path: Path) -> None:
    x, marks, _ = data.test.batch(torch.arange(EXPORT_WINDOWS))
    path = tmp_path / MODEL_FILE
    _export(KeepsItsBatch(), (x, marks), path, ["x", "marks"], ["forecast"])
    assert baked_shapes(path, {EXPORT_WINDOWS}) != []
    assert run_session(path, {"x": x[:1].numpy()})[0].shape[0] == EXPORT_WINDOWS  # one window in, eleven out
    with pytest.raises(ValueError, match=f"returned {EXPORT_WINDOWS} forecasts for 1 windows"):
        OnnxForecaster(path, None, TINY["horizon"])(x[:1], marks[:1])
    info = BundleInfo(client_id="gw", round=1, model="federated", columns=list(data.columns),
                      mean=[0.0] * data.n_features, std=[1.0] * data.n_features, lookback=TINY["lookback"],
                      horizon=TINY["horizon"], step_ns=3_600 * 10**9,
                      onnx_sha256=hashlib.sha256(path.read_bytes()).hexdigest(), verified_max_error=0.0)
    (tmp_path / INFO_FILE).write_text(info.model_dump_json())
    with pytest.raises(ValueError, match=f"returned {EXPORT_WINDOWS} forecasts for 1 windows"):
        OnnxServing(tmp_path).forecast(np.arange(TINY["lookback"]) * info.step_ns, x[0].numpy())
    with pytest.raises(ExportMismatchError, match="at batch 1: output 0 has shape"):
        export_module(KeepsItsBatch(), tmp_path / "bundle", data)


def test_a_failed_export_leaves_nothing_behind(data: ClientData, tmp_path: Path) -> None:
    model = build(Cell("spikernn", "channel", "shared", None), data)
    with pytest.raises(ExportMismatchError, match="differs from torch"):
        export_onnx(model, tmp_path / "out", data.test, EXPORT_WINDOWS, tolerance=0.0, timed=False)
    assert not (tmp_path / "out").exists()


def test_the_cli_exports_the_default_recipes_spiking_model_and_refuses_bad_input_in_one_line(
        data: ClientData, tmp_path: Path) -> None:
    model = build(Cell("spikernn", "channel", "shared", None), data)
    assert model.n_features > 1 and model.cfg.seasonal_base  # the recipe: channel-independent, shared head
    save_checkpoint(model, tmp_path / "m.safetensors", list(data.columns))

    def export(windows: str, out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgefl.cli", "export", "onnx", "--checkpoint",
                               str(tmp_path / "m.safetensors"), "--site", "amsterdam", "--windows", windows,
                               "--out", str(out)], capture_output=True, text=True, timeout=300)

    proc = export("16", tmp_path / "onnx")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "% identical" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [f"{n}.onnx" for n in
                                                                     ("encode", "model", "readout", "step")]
    proc = export("0", tmp_path / "none")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--windows" in proc.stderr, proc.stderr
    assert not (tmp_path / "none").exists()
