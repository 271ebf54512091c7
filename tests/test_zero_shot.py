"""Zero-shot forecasts with the foundation model alone for a gateway with too little history, and
the move to the agent's own model once it has history and trained state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edge_agent.config import AgentConfig
from edge_agent.data import DataError, SeriesTable, load_site, min_training_rows
from edge_agent.forecast import forecast
from edge_agent.learners import make_learner
from edge_agent.models.foundation import FoundationError, FoundationModel, save_foundation
from edge_agent.models.foundation_config import FoundationConfig
from edge_agent.state import AgentState
from edge_agent.zero_shot import zero_shot_forecast
from tests.conftest import small_config
from tests.test_cli import edgefl

SMALL = FoundationConfig(window=12, d_model=16, heads=2, layers=1, d_ff=32, dropout=0.0)
COLUMNS = ["temp_air", "relative_humidity", "ghi"]
HORIZON = 4
NEEDED = min_training_rows(24, HORIZON)


@pytest.fixture(scope="module")
def amsterdam() -> SeriesTable:
    return load_site("amsterdam").select(COLUMNS)


@pytest.fixture
def foundation(tmp_path: Path) -> tuple[Path, str]:
    torch.manual_seed(5)
    path = tmp_path / "fm.safetensors"
    return path, save_foundation(FoundationModel(SMALL), path)


def write_gateway_csv(path: Path, table: SeriesTable, rows: int, columns: list[str] = COLUMNS) -> Path:
    """The first ``rows`` hours of a real site, as a gateway's CSV."""
    frame = pd.DataFrame(table.values[:rows], columns=columns)
    frame.insert(0, "date", table.index[:rows].strftime("%Y-%m-%d %H:%M:%S"))
    frame.to_csv(path, index=False)
    return path


def agent_config(tmp_path: Path, csv: Path, **fields: object) -> AgentConfig:
    """A head-mode agent on ``csv`` (small model, horizon 4), or with ``mode="prompt"`` a prompt-mode one."""
    model = {} if fields.get("mode") == "prompt" else {"model": small_config("dlinear", horizon=HORIZON).model_dump()}
    return AgentConfig.model_validate({
        "fleet": "farm", "client_id": "agent01", "state_dir": tmp_path / "state", "data": {"csv": csv},
        "training": {"stride": 24}, **model, **fields,
    })


def by_hand(path: Path, recent: np.ndarray, horizon: int) -> np.ndarray:
    """The foundation model run on the standardized context plus zeroed future, back in data units."""
    from edge_agent.models.foundation import load_foundation

    model = load_foundation(path)
    mean, std = recent.mean(axis=0), recent.std(axis=0)
    context = SMALL.window - horizon
    x = torch.zeros(1, SMALL.window, len(SMALL.variables))
    where = [SMALL.variables.index(c) for c in COLUMNS]
    x[0, :context, where] = torch.tensor((recent[-context:] - mean) / std, dtype=torch.float32)
    with torch.no_grad():
        out = model(x)[0, context:, where].numpy()
    return out * std + mean


def test_a_gateway_with_30_rows_gets_the_foundation_models_forecast(tmp_path, amsterdam, foundation) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, 30)
    result = forecast(agent_config(tmp_path, csv, zero_shot_foundation=foundation[0]))
    assert result.zero_shot and result.model == f"zero-shot foundation (30 rows of history; local training needs {NEEDED})"
    assert result.columns == COLUMNS and result.values.shape == (HORIZON, 3)
    assert result.stamps == [str(amsterdam.index[29] + pd.Timedelta(hours=h)) for h in range(1, HORIZON + 1)]
    expected = by_hand(foundation[0], amsterdam.values[:30].astype(np.float64), HORIZON)
    np.testing.assert_allclose(result.values.numpy(), expected, rtol=1e-4, atol=1e-3)
    temp = result.values[:, 0]
    assert torch.isfinite(result.values).all() and (temp.abs() < 60).all()  # degrees C, not standardized units


def test_zero_shot_refuses_unknown_variables_gaps_and_a_horizon_filling_the_window(amsterdam) -> None:
    model = FoundationModel(SMALL).eval()
    recent = SeriesTable("gw", amsterdam.index[:30], amsterdam.values[:30], amsterdam.columns)
    renamed = SeriesTable("gw", recent.index, recent.values, ("temp_air", "OT", "ghi"))
    with pytest.raises(DataError, match=r"gw: variables \['OT'\] are not in the foundation model's"):
        zero_shot_forecast(model, renamed, HORIZON)
    observed = np.ones(recent.values.shape, dtype=bool)
    observed[-3, 1] = False
    gappy = SeriesTable("gw", recent.index, recent.values, recent.columns, observed=observed)
    with pytest.raises(DataError, match="gw: the latest 8 steps have a gap"):
        zero_shot_forecast(model, gappy, HORIZON)
    assert zero_shot_forecast(model, gappy, 10).shape == (10, 3)  # a context of 2 rows ends after the gap
    with pytest.raises(ValueError, match="horizon 12: .* < the foundation window 12"):
        zero_shot_forecast(model, recent, 12)
    short = SeriesTable("gw", recent.index[:5], recent.values[:5], recent.columns)
    with pytest.raises(DataError, match=r"gw: 5 rows; a zero-shot forecast of 4 steps needs the latest 8"):
        zero_shot_forecast(model, short, HORIZON)


def test_without_a_zero_shot_foundation_the_best_anchor_serves_and_says_why(tmp_path, amsterdam) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, 30)
    result = forecast(agent_config(tmp_path, csv))
    assert result.anchor == (f"30 rows of history; local training needs {NEEDED}; 30 rows leave no season to test "
                             "on: seasonal naive")
    assert result.model in ("seasonal_naive", "seasonal_naive_week", "window_average", "ets", "ets_noseason", "theta")
    assert result.values.shape == (HORIZON, 3) and np.isfinite(result.values.numpy()).all()
    with pytest.raises(DataError, match=f"gw.csv: 30 rows of history; local training needs {NEEDED}; an ONNX model"):
        forecast(agent_config(tmp_path, csv), onnx_model=tmp_path / "model.onnx")


def test_zero_shot_settings_are_checked(tmp_path, amsterdam, foundation) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, 30)
    with pytest.raises(ValueError, match="zero_shot_foundation: mode 'prompt' forecasts zero-shot with its foundation"):
        agent_config(tmp_path, csv, mode="prompt", foundation=foundation[0],
                     zero_shot_foundation=foundation[0])
    with pytest.raises(ValueError, match="zero_shot_foundation_sha256: given without zero_shot_foundation"):
        agent_config(tmp_path, csv, zero_shot_foundation_sha256="0" * 64)
    cfg = agent_config(tmp_path, csv, zero_shot_foundation=foundation[0], zero_shot_foundation_sha256="0" * 64)
    with pytest.raises(FoundationError, match="fm.safetensors: backbone"):
        forecast(cfg)
    cfg = agent_config(tmp_path, csv, zero_shot_foundation=foundation[0], zero_shot_foundation_sha256=foundation[1])
    assert forecast(cfg).zero_shot


def test_with_history_and_trained_state_the_agents_own_model_serves(tmp_path, amsterdam, foundation) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, NEEDED + 48)
    cfg = agent_config(tmp_path, csv, zero_shot_foundation=foundation[0],
                       training={"stride": 24, "keep_local": False, "anchors": []})
    before = forecast(cfg)
    assert before.zero_shot and before.model == f"zero-shot foundation (no model trained yet in {cfg.state_dir})"
    learner = make_learner(cfg, cfg.data.load())
    learner.train(1)
    AgentState(cfg.state_dir).save_personal(learner)
    after = forecast(cfg)
    assert not after.zero_shot and after.model == "federated" and after.values.shape == (HORIZON, 3)
    assert after.stamps == before.stamps


def test_prompt_mode_with_too_little_history_forecasts_with_its_own_foundation(tmp_path, amsterdam,
                                                                                 foundation) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, 15)
    cfg = agent_config(tmp_path, csv, mode="prompt", foundation=foundation[0],
                       prompt={"lookback": 8, "horizon": HORIZON})
    result = forecast(cfg)
    needed = min_training_rows(SMALL.window, 1)  # 17: prompt learners cut whole foundation windows
    assert result.model == f"zero-shot foundation (15 rows of history; local training needs {needed})"
    np.testing.assert_allclose(result.values.numpy(), by_hand(foundation[0], amsterdam.values[:15], HORIZON),
                               rtol=1e-4, atol=1e-3)


def test_the_cli_says_the_foundation_forecast_alone_and_the_daemon_waits_for_history(tmp_path, amsterdam,
                                                                                      foundation) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", amsterdam, 30)
    config = tmp_path / "agent.toml"
    config.write_text(f'fleet = "farm"\nclient_id = "agent01"\nstate_dir = "{tmp_path / "state"}"\n'
                      f'zero_shot_foundation = "{foundation[0]}"\n[data]\ncsv = "{csv}"\n'
                      f'[model]\nlookback = 24\nhorizon = {HORIZON}\nd_qap = 16\n')
    proc = edgefl("agent", "forecast", "--csv", "-c", str(config))
    assert proc.returncode == 0, proc.stderr
    assert (f"agent01: forecast by zero-shot foundation (30 rows of history; local training needs {NEEDED})"
            in " ".join(proc.stderr.split()))
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "time,temp_air,relative_humidity,ghi" and len(lines) == 1 + HORIZON
    proc = edgefl("agent", "run", "-c", str(config))
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and f"gw.csv: needs at least {NEEDED} rows for lookback 24 + horizon 4 (has 30)" in message
    assert "Traceback" not in proc.stdout + proc.stderr
