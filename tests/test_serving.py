"""Serving bundles: the calendar inputs without pandas, the bundle written after a round and its
forecast equal to torch's, bad bundles refused by name, and the serving module free of torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.data import load_site, prepare_client
from edge_agent.learners import HeadLearner
from export.bundle import write_bundle
from edge_agent.serving.calendar import calendar_features
from edge_agent.serving.onnx_serving import INFO_FILE, MODEL_FILE, OnnxServing
from edge_agent.training_settings import HeadTraining
from tests.conftest import small_config


def test_calendar_features_match_pandas_calendar_fields() -> None:
    index = pd.date_range("2019-12-28 00:00", periods=2000, freq="37min")
    fraction = (index.hour + index.minute / 60.0) / 24.0
    expected = np.stack([np.sin(2 * np.pi * fraction), np.cos(2 * np.pi * fraction),
                         np.sin(2 * np.pi * (index.day_of_week + fraction) / 7),
                         np.cos(2 * np.pi * (index.day_of_week + fraction) / 7)], axis=1).astype(np.float32)
    np.testing.assert_array_equal(calendar_features(index.as_unit("ns").asi8), expected)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, HeadLearner]:
    data = prepare_client(load_site("miami").select(["temp_air", "ghi"]), 24, 12, stride=24)
    learner = HeadLearner(small_config("dlinear", quantiles=(0.1, 0.5, 0.9)), data, HeadTraining(batch_size=64), 3, 0)
    learner.train(1)
    folder = tmp_path_factory.mktemp("serving")
    write_bundle(learner, "gw", 2, pd.Timedelta(hours=1).value, folder)
    return folder, learner


def test_a_bundle_forecasts_what_the_torch_model_forecasts(bundle) -> None:
    folder, learner = bundle
    server = OnnxServing(folder)
    x, marks, _ = next(iter(learner.data.test.batches(1, shuffle=False)))
    scaler = learner.data.scaler
    values = scaler.inverse_transform(x[0].numpy().astype(np.float64))
    times = pd.date_range("2021-06-01 00:00", periods=24, freq="h").as_unit("ns")
    published = server.forecast(times.asi8, values)
    with torch.no_grad():
        expected = learner.model.forward_quantiles(torch.from_numpy(scaler.transform(values).astype(np.float32))[None],
                                                   torch.from_numpy(calendar_features(times.asi8))[None])[0]
    median = scaler.inverse_transform(expected[..., 1].numpy())
    got = np.array([published["forecast"][c]["value"] for c in ("temp_air", "ghi")]).T
    np.testing.assert_allclose(got, median, rtol=1e-5, atol=1e-4)
    assert published["window_end"] == "2021-06-01T23:00:00Z" and published["times"][0] == "2021-06-02T00:00:00Z"
    low = np.array(published["forecast"]["temp_air"]["q0.1"])
    assert (low <= np.array(published["forecast"]["temp_air"]["value"])).all()
    assert published["levels"] == [0.1, 0.5, 0.9] and published["round"] == 1


@pytest.mark.parametrize(("change", "reason"), [
    (lambda info: info.update(std=[0.0, 1.0]), "std finite and positive"),
    (lambda info: info.update(mean=[0.0]), "one entry per feature"),
    (lambda info: info.update(onnx_sha256="0" * 64), "does not match the sha256"),
    (lambda info: info.update(surprise=1), "Extra inputs are not permitted"),
])
def test_a_bad_bundle_is_refused_by_name(bundle, tmp_path: Path, change, reason: str) -> None:
    folder, _ = bundle
    (tmp_path / MODEL_FILE).write_bytes((folder / MODEL_FILE).read_bytes())
    info = json.loads((folder / INFO_FILE).read_text())
    change(info)
    (tmp_path / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(ValueError, match=reason):
        OnnxServing(tmp_path)


def test_the_serving_path_imports_neither_torch_nor_pandas(bundle) -> None:
    folder, _ = bundle
    script = ("import sys, numpy as np\n"
              "from edge_agent.serving.onnx_serving import OnnxServing\n"
              f"server = OnnxServing({str(folder)!r})\n"
              "times = np.arange(24, dtype=np.int64) * 3_600_000_000_000\n"
              "out = server.forecast(times, np.ones((24, 2)))\n"
              "print(len(out['times']), 'torch' in sys.modules, 'pandas' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["12", "False", "False"]
