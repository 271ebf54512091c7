"""The exporter contract: ONNX, NIR and Lava share one signature, one report and one mismatch error."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path

import nir
import numpy as np
import pytest

from edge_agent.data import ClientData, load_site, prepare_client
from edge_agent.models import Forecaster
from export import FORMATS, exporter
from export.contract import ExportMismatchError, ExportReport
from export.lava import read_netx
from export.onnx import run_session
from tests.conftest import trained

OUT = {"onnx": "onnx", "nir": "model.nir", "lava": "model.net"}  # a folder for ONNX, a file otherwise


@pytest.fixture(scope="module")
def site() -> ClientData:
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


@pytest.fixture(scope="module")
def model(site: ClientData) -> Forecaster:
    return trained("spikernn", site)


def test_every_exporter_has_the_shared_signature() -> None:
    for fmt in FORMATS:
        function = exporter(fmt)
        parameters = list(inspect.signature(function).parameters.values())
        hints = typing.get_type_hints(function)
        shared = [(p.name, p.kind, hints[p.name]) for p in parameters[:4]]
        assert [(name, kind) for name, kind, _ in shared] == [
            (name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ("model", "out", "windows", "n_windows")
        ], fmt
        assert [hint for _, _, hint in shared] == [Forecaster, Path, hints["windows"], int], fmt
        assert parameters[3].default > 0, fmt
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not p.empty for p in parameters[4:]), fmt
        assert hints["return"] is ExportReport, fmt
    with pytest.raises(ValueError, match="unknown export format 'tflite'"):
        exporter("tflite")


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_exporter_returns_a_json_ready_report(fmt: str, model, site, tmp_path: Path) -> None:
    report = exporter(fmt)(model, tmp_path / OUT[fmt], site.test, 16)
    assert isinstance(report, ExportReport) and report.format == fmt and report.windows == 16
    assert report.files and all(Path(name).is_file() for name in report.files)
    assert 0.99 <= report.spike_agreement <= 1.0 and report.steps == 4
    assert report.firing_rates and all(0 < rate < 1 for rate in report.firing_rates.values())
    assert json.loads(json.dumps(report.as_dict())) == report.as_dict()


def _shift_forecast(monkeypatch: pytest.MonkeyPatch) -> None:
    def shifted(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        forecast, *rest = run_session(path, feeds)
        return [forecast + 1e-3, *rest]

    monkeypatch.setattr("export.onnx.run_session", shifted)


def _halve_nir_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    def halved(path: Path) -> nir.NIRGraph:
        graph = nir.read(path)
        graph.nodes["lif1"].v_threshold = graph.nodes["lif1"].v_threshold * 0.5
        return graph

    monkeypatch.setattr("export.nir.read_nir", halved)


def _double_netx_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    def doubled(path: Path) -> dict:
        netx = read_netx(path)
        netx["layer"][1]["neuron"]["vThMant"] *= 2  # the first LIF layer (0 is the input) fires most
        return netx

    monkeypatch.setattr("export.lava.read_netx", doubled)


CORRUPT = {"onnx": _shift_forecast, "nir": _halve_nir_threshold, "lava": _double_netx_threshold}


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupted_export_raises_the_one_mismatch_error(fmt: str, model, site, tmp_path, monkeypatch) -> None:
    CORRUPT[fmt](monkeypatch)
    with pytest.raises(ExportMismatchError, match=r"model\.onnx|shared\.backbone\.stack\.\d"):
        exporter(fmt)(model, tmp_path / OUT[fmt], site.test, 16)
    if fmt != "onnx":  # a file export keeps only verified files
        assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def quantile_model(site: ClientData) -> Forecaster:
    return trained("spikernn", site, quantiles=(0.1, 0.5, 0.9))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_quantile_model_exports_under_the_same_contract(fmt: str, quantile_model, site, tmp_path,
                                                          monkeypatch) -> None:
    """ONNX carries every level (checked like a point forecast, so a shifted one is refused); NIR
    and Lava carry the backbone's stack, which a quantile head leaves as it is."""
    report = exporter(fmt)(quantile_model, tmp_path / OUT[fmt], site.test, 16)
    assert report.format == fmt and 0.99 <= report.spike_agreement <= 1.0
    assert json.loads(json.dumps(report.as_dict())) == report.as_dict()
    CORRUPT[fmt](monkeypatch)
    with pytest.raises(ExportMismatchError, match=r"model\.onnx|shared\.backbone\.stack\.\d"):
        exporter(fmt)(quantile_model, tmp_path / f"corrupt_{OUT[fmt]}", site.test, 16)
