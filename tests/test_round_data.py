"""A head-mode round's data and anchor forecasts are prepared in a process of their own
(``edge_agent.round_data``): the training process built on them imports neither pandas nor
statsforecast (nor torch._dynamo, which ``edge_agent.train.ForeachAdam`` keeps out), and scores, chooses what to serve and trains exactly as a learner built on the
gateway's table in one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from edge_agent.candidates import validation_scores
from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.data import load_site
from edge_agent.learners import make_learner
from edge_agent.round_data import ANCHOR_CACHE, ANCHOR_PREFIX, DATA_JOB_FILE, ROUND_DATA, DataJob, prepare, save_npz
from tests.test_zero_shot import COLUMNS, write_gateway_csv

ROWS = 700  # the live gateway benchmark's history: 29 days
TRAINING_PROCESS = """
import json, sys
from pathlib import Path
from edge_agent.config import AgentConfig, load_config
from edge_agent.training_child import round_learner

learner, _ = round_learner(load_config(Path(sys.argv[1]), AgentConfig), Path(sys.argv[2]))
metrics = learner.serving_metrics(1)
loss = learner.train(1)
heavy = sorted(name for name in sys.modules
               if name.split(".")[0] in ("pandas", "pyarrow", "statsforecast") or name.startswith("torch._dynamo"))
print(json.dumps({"metrics": metrics, "loss": loss, "heavy": heavy}))
"""


def run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_training_process_holds_neither_pandas_nor_statsforecast_and_serves_and_trains_the_same(
        tmp_path: Path) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", load_site("amsterdam").select(COLUMNS), ROWS)
    path = tmp_path / "agent.toml"
    path.write_text(dump_toml({"fleet": "farm", "client_id": "agent01", "state_dir": str(tmp_path / "state"),
                               "data": {"csv": str(csv)}}))  # the default recipe: ETS and Theta among the anchors
    cfg = load_config(path, AgentConfig)
    folder = tmp_path / "training"
    folder.mkdir()
    (folder / DATA_JOB_FILE).write_text(DataJob.of(cfg).model_dump_json(exclude_unset=True))

    run("-m", "edge_agent.round_data", str(folder / DATA_JOB_FILE))
    assert (folder / ROUND_DATA).is_file()
    child = json.loads(run("-c", TRAINING_PROCESS, str(path), str(folder)))

    assert child["heavy"] == []
    alone = make_learner(cfg, cfg.data.load())
    metrics = alone.serving_metrics(1)
    assert {"ets", "theta"} <= validation_scores(metrics).keys()
    assert child["metrics"] == metrics
    assert child["loss"] == alone.train(1)


def test_a_round_on_unchanged_data_reuses_the_last_rounds_anchor_forecasts_and_new_data_refits_them(
        tmp_path: Path, caplog) -> None:
    csv = write_gateway_csv(tmp_path / "gw.csv", load_site("amsterdam").select(COLUMNS), ROWS)
    path = tmp_path / "agent.toml"
    path.write_text(dump_toml({"fleet": "farm", "client_id": "agent01", "state_dir": str(tmp_path / "state"),
                               "data": {"csv": str(csv)}, "training": {"anchors": ["seasonal_naive", "ets"]}}))
    job = DataJob.of(load_config(path, AgentConfig))
    job.state_dir.mkdir()
    first = prepare(job)
    cache = job.state_dir / ANCHOR_CACHE
    with np.load(cache) as saved:
        marked = {name: saved[name] + 1.0 if name.startswith(ANCHOR_PREFIX) else saved[name] for name in saved.files}
    save_npz(cache, marked)  # the same key: a second round on the same data reads these, fits nothing
    again = prepare(job)
    assert set(again) == set(first)
    for name in ("anchor.val.seasonal_naive", "anchor.val.ets", "anchor.test.ets"):
        np.testing.assert_array_equal(again[name], first[name] + 1.0)

    write_gateway_csv(csv, load_site("amsterdam").select(COLUMNS), ROWS + 24)  # a day more: fitted again
    grown = prepare(job)
    assert grown["anchor.test.ets"].shape[0] > first["anchor.test.ets"].shape[0]
    cache.write_bytes(b"not an npz")  # a broken cache is made again, with a warning
    np.testing.assert_array_equal(prepare(job)["anchor.test.ets"], grown["anchor.test.ets"])
    assert "unreadable" in caplog.text
