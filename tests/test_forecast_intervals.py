"""`agent forecast` of a quantile model: the median and its interval in the data's units, every
level in the CSV, the interval conformal-calibrated on the gateway's own validation windows, the
same in torch and in ONNX Runtime; the zero-shot foundation stays point-only."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.conformal import conformity_scores
from edge_agent.data import SeriesTable, load_site, prepare_client
from edge_agent.forecast import forecast, load_local_model
from edge_agent.learners import make_learner
from edge_agent.models.foundation import FoundationModel, save_foundation
from edge_agent.state import AgentState
from export.onnx import export_onnx
from tests.conftest import small_config
from tests.test_cli import edgefl
from tests.test_zero_shot import COLUMNS, SMALL, write_gateway_csv

LEVELS = (0.1, 0.5, 0.9)
HORIZON = 6


@pytest.fixture(scope="module")
def amsterdam() -> SeriesTable:
    return load_site("amsterdam").select(COLUMNS)


def agent_toml(folder: Path, csv: Path, levels: tuple[float, ...] | None = LEVELS, **fields: object) -> Path:
    """A head-mode agent.toml on ``csv`` with a small quantile model (``levels``)."""
    model = small_config("dlinear", horizon=HORIZON, quantiles=levels).model_dump(exclude_none=True)
    data = {"fleet": "farm", "client_id": "agent01", "state_dir": str(folder / "state"), "data": {"csv": str(csv)},
            "training": {"stride": 24}, "model": model, **fields}
    path = folder / "agent.toml"
    path.write_text(dump_toml(data))
    return path


def config(path: Path) -> AgentConfig:
    return load_config(path, AgentConfig)


@pytest.fixture(scope="module")
def trained_agent(tmp_path_factory, amsterdam) -> Path:
    """agent.toml of a gateway with 2000 hours of Amsterdam and a quantile model trained one round."""
    folder = tmp_path_factory.mktemp("gateway")
    path = agent_toml(folder, write_gateway_csv(folder / "gw.csv", amsterdam, 2000))
    cfg = config(path)
    learner = make_learner(cfg, cfg.data.load())
    learner.train(1)
    AgentState(cfg.state_dir).save_personal(learner)
    return path


def test_the_csv_has_every_level_and_each_row_is_ordered(trained_agent: Path) -> None:
    proc = edgefl("agent", "forecast", "--csv", "-c", str(trained_agent))
    assert proc.returncode == 0, proc.stderr
    assert "agent01: 80% interval (q0.1-q0.9), the model's own quantiles (not calibrated)" in proc.stderr
    lines = proc.stdout.strip().splitlines()
    header = ["time", *(f"{c}{suffix}" for c in COLUMNS for suffix in ("", "_q0.1", "_q0.9"))]
    assert lines[0].split(",") == header and len(lines) == 1 + HORIZON
    for line in lines[1:]:
        values = [float(v) for v in line.split(",")[1:]]
        for median, lower, upper in zip(values[::3], values[1::3], values[2::3]):
            assert lower <= median <= upper, line


def test_the_table_shows_the_median_and_the_conformal_interval(trained_agent: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # a terminal wide enough for one line per step
    cfg = config(trained_agent)
    windows = len(prepare_client(cfg.data.load(), cfg.model.lookback, HORIZON).val)
    proc = edgefl("agent", "forecast", "--conformal", "-c", str(trained_agent))
    assert proc.returncode == 0, proc.stderr
    assert f"80% interval (q0.1-q0.9), conformal-calibrated on {windows} validation windows" in proc.stderr
    assert "median [q0.1, q0.9]" in proc.stdout
    result = forecast(cfg, conformal=True)
    first = ", ".join(f"{float(result.quantiles[0, 0, j]):.3f}" for j in (0, -1))
    assert f"{float(result.values[0, 0]):.3f} [{first}]" in proc.stdout


def test_the_forecast_interval_is_widened_by_offsets_that_cover_the_validation_windows(trained_agent: Path) -> None:
    """By construction (CQR eq. 7) the calibrated interval covers at least ceil(0.8 (n + 1)) of the
    n validation targets of each step and feature, and the median is left alone."""
    cfg = config(trained_agent)
    raw, calibrated = forecast(cfg), forecast(cfg, conformal=True)
    torch.testing.assert_close(raw.values, calibrated.values)
    assert (calibrated.quantiles.diff(dim=-1) >= 0).all()
    table = cfg.data.load()
    data = prepare_client(table, cfg.model.lookback, HORIZON)
    std = torch.as_tensor(data.scaler.std)
    lower = (raw.quantiles[..., 0] - calibrated.quantiles[..., 0]) / std  # the offsets, on the scaled axis
    upper = (calibrated.quantiles[..., -1] - raw.quantiles[..., -1]) / std
    clamped = (calibrated.quantiles[..., 0] == calibrated.values) | (calibrated.quantiles[..., -1] == calibrated.values)
    clamped |= calibrated.quantiles[..., 0] == 0  # floored: the feature is never negative (edge_agent.forecast)
    torch.testing.assert_close(lower[~clamped], upper[~clamped], atol=1e-4, rtol=0)
    model = load_local_model(cfg, table).eval()
    x, marks, y = data.val.batch(torch.arange(len(data.val)))
    with torch.no_grad():
        scores = conformity_scores(model.forward_quantiles(x, marks), y)
    need = math.ceil(0.8 * (len(data.val) + 1))
    covered = (scores <= upper + 1e-4).sum(0)
    assert (covered[~clamped] >= need).all()


def test_torch_and_onnx_runtime_forecast_the_same_interval(trained_agent: Path, tmp_path: Path) -> None:
    cfg = config(trained_agent)
    table = cfg.data.load()
    data = prepare_client(table, cfg.model.lookback, HORIZON)
    export_onnx(load_local_model(cfg, table), tmp_path, data.test, n_windows=8)
    std = torch.as_tensor(data.scaler.std)
    for conformal in (False, True):
        by_torch = forecast(cfg, conformal=conformal)
        by_onnx = forecast(cfg, tmp_path / "model.onnx", conformal=conformal)
        assert by_onnx.interval == by_torch.interval and by_onnx.model == str(tmp_path / "model.onnx")
        difference = (by_onnx.quantiles - by_torch.quantiles) / std[:, None]
        assert difference.abs().max() <= 1e-4


def test_a_point_model_refuses_conformal_calibration(tmp_path: Path, amsterdam) -> None:
    path = agent_toml(tmp_path, write_gateway_csv(tmp_path / "gw.csv", amsterdam, 400), levels=None)
    with pytest.raises(ValueError, match="conformal calibration is of quantile intervals; this agent's model "
                                         "forecasts points"):
        forecast(config(path), conformal=True)


def test_the_zero_shot_foundation_stays_point_only_and_says_so(tmp_path: Path, amsterdam) -> None:
    torch.manual_seed(5)
    foundation = tmp_path / "fm.safetensors"
    save_foundation(FoundationModel(SMALL), foundation)
    path = agent_toml(tmp_path, write_gateway_csv(tmp_path / "gw.csv", amsterdam, 30),
                      zero_shot_foundation=str(foundation))
    result = forecast(config(path), conformal=True)
    assert result.zero_shot and result.quantiles is None and result.levels == ()
    assert result.interval == "point forecast only: the zero-shot foundation predicts no quantiles"
    assert result.csv_lines()[0] == "time," + ",".join(COLUMNS)


def test_before_training_the_forecast_says_so_serves_no_untrained_model_and_fits_80_columns(
    trained_agent: Path, tmp_path: Path, amsterdam, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    untrained = agent_toml(tmp_path, write_gateway_csv(tmp_path / "gw.csv", amsterdam, 2000))
    proc = edgefl("agent", "forecast", "-c", str(untrained))
    assert proc.returncode == 0, proc.stderr
    assert "agent01: no model trained yet; scoring seasonal_naive" in proc.stderr
    served = next(line for line in proc.stderr.splitlines() if "forecast by the" in line)
    assert f"no model trained yet in {tmp_path / 'state'}; best on validation" in served
    assert "federated" not in served and "local" not in served
    assert "…" not in proc.stdout and max(map(len, proc.stdout.splitlines())) <= 80
    trained = edgefl("agent", "forecast", "-c", str(trained_agent))  # intervals: wider cells, more tables
    assert trained.returncode == 0 and "…" not in trained.stdout, trained.stderr
    assert max(map(len, trained.stdout.splitlines())) <= 80
    assert all(column in trained.stdout for column in COLUMNS)
