"""Every benchmark gives the same numbers when run again with the same seeds, also after other
jobs ran in the same worker process (the way ``run_parallel`` reuses workers)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
TIMINGS = {"seconds", "torch_ms", "onnx_ms", "onnx_speedup"}  # wall-clock figures, different on every run

FEDQAPER = {"clients": 3, "f_max": 3, "seed": 1, "lookback": 24, "horizon": 12, "d_qap": 8, "qap_heads": 2,
            "hidden": 8, "d_ff": 16, "heads": 2, "stride": 97, "val_stride": 31, "batch_size": 32, "lr": 3e-3,
            "rounds": 2, "local_epochs": 1, "local_max_epochs": 2, "patience": 1}
FEDDTW = {"lookback": 10, "horizon": 5, "stride": 61, "val_stride": 23, "d_qap": 8, "qap_heads": 2, "hidden": 8,
          "batch_size": 64, "lr": 3e-3, "rounds": 3, "local_epochs": 1, "absence": 0.5, "clusters": 3, "stretch": 2}
FEDPOD = {"rounds": 1, "local_epochs": 1, "stride": 97, "pretrain_rounds": 1, "pretrain_stride": 97, "seed": 42}
VALUE = {"clients": 3, "f_max": 3, "val_stride": 31, "rounds": 2, "local_epochs": 1, "personal_epochs": 1,
         "learned": ["local", "fedavg"], "anchors": ["seasonal_naive", "window_average", "theta"]}
ROBUSTNESS = {**FEDQAPER, "clients": 4, "f_max": 4, "stride": 193, "val_stride": 97, "batch_size": 64, "rounds": 2,
              "max_windows": 16, "patience": 1}
ROUND_POLICY = {**ROBUSTNESS, "rounds": 3, "straggler": 4.0, "deadline_s": 30.0, "buffer_size": 3}
FEDAL = {"folds": [["greensboro", "amsterdam"]], "steps": ["1h"], "single_variables": ["temp_air"], "rounds": 1,
         "local_epochs": 1, "participation": 0.5, "stride": 97, "test_every": 50, "prox_mu": 0.01, "rates": [0.5],
         "horizon": 12, "history_days": 14, "local_epochs_max": 1, "local_patience": 1, "attack_clients": 1,
         "sigmas": [0.5], "seeds": [1]}
FEDGAME = {"lookback": 24, "backbone": "dlinear", "d_qap": 8, "qap_heads": 2, "quantiles": [0.1, 0.5, 0.9],
           "rounds": 2, "local_epochs": 1, "batch_size": 32, "lr": 3e-3, "patience": 1, "prox_mu": 0.01,
           "game_lr": 5e-4, "game_steps": 3, "max_windows": 16, "val_stride": 31}
ENERGY = {"site": "greensboro", "lookback": 24, "horizon": 12, "stride": 97, "epochs": 1, "batch_size": 64,
          "lr": 1e-3, "test_windows": 8, "seed": 7}


def numbers(result: object) -> object:
    """A result without its timings."""
    if isinstance(result, dict):
        return {k: numbers(v) for k, v in result.items() if k not in TIMINGS}
    if isinstance(result, list):
        return [numbers(v) for v in result]
    return result.tolist() if isinstance(result, np.ndarray) else result


def twice(job, first: tuple, other: tuple) -> tuple[object, object]:
    """``job(*first)``, then another job in the same process, then ``job(*first)`` again; jobs set
    torch's thread count (one here), which is restored afterwards for the tests that follow."""
    threads = torch.get_num_threads()
    try:
        before = numbers(job(*first, 1))
        job(*other, 1)
        return before, numbers(job(*first, 1))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(("bench", "first", "other"), [
    ("fedqaper", ("dlinear", "fed", FEDQAPER), ("dlinear", "local", FEDQAPER)),
    ("feddtw", ("dlinear", 1, "rcd", "wsf", FEDDTW), ("dlinear", 2, "du", "maf", FEDDTW)),
    ("fedpod", ("fedpod", "task2", 1, FEDPOD), ("scratch_fedavg", "task1", 2, FEDPOD)),
    ("energy", ("spikernn", ENERGY), ("dlinear", ENERGY)),
    ("fedal", ("fedal", 0, 1, FEDAL), ("fedprox", 0, 2, FEDAL)),
    ("value", ("stations", 14, "dlinear", None, 1, VALUE), ("stations", 14, None, "theta", None, VALUE)),
    ("fedgame", ("stations", 6, "fedgame", "game", 1, FEDGAME), ("stations", 6, "no_fl", "game", 2, FEDGAME)),
    ("robustness", ("trimmed_mean", "sign_flip", 1, 1, ROBUSTNESS), ("fedavg", "value_1e30", 2, 2, ROBUSTNESS)),
    ("round_policy", ("buffered", 1, ROUND_POLICY), ("sync_quorum", 2, ROUND_POLICY)),
])
def test_a_benchmark_job_gives_the_same_numbers_when_run_again(bench: str, first: tuple, other: tuple) -> None:
    module = importlib.import_module(bench)
    before, after = twice(module.run_job, first, other)
    assert before == after


def test_a_benchmark_process_computes_on_the_avx2_kernels_whatever_the_cpu() -> None:
    """bench/common.py pins MKL, oneDNN and ATen to their AVX2 paths before torch loads, so a
    results file re-run on an AVX-512 machine gives the same bits as on the machine that wrote it
    (checked once under ``qemu-x86_64 -cpu Haswell``: docs/tutorials/benchmarks.md)."""
    from common import PORTABLE_MATH, native_environment

    unpinned = {k: v for k, v in os.environ.items() if k not in PORTABLE_MATH}
    bench = Path(__file__).resolve().parent.parent / "bench"

    def kernels(*imports: str, env: dict[str, str] = unpinned) -> str:
        code = f"import {', '.join([*imports, 'torch'])}; print(torch.backends.cpu.get_cpu_capability())"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=bench,
                              check=True).stdout.strip()

    native = kernels()
    if native not in ("AVX2", "AVX512"):
        pytest.skip(f"this CPU's kernels are {native}, below AVX2")
    assert kernels("common") == "AVX2"
    # a child that times torch against ONNX Runtime (bench/energy.py) runs on the CPU's own kernels
    assert kernels("common", env=native_environment()) == native


def test_value_serves_daily_beside_what_pooling_would_buy_and_replays_from_saved_windows(tmp_path: Path) -> None:
    """One scarce cell: the served gateways choose among their own candidates every test window,
    the scarce verdict stands beside Centralized's bound, and what the product serves one
    candidate at a time (``combine`` 1) is re-chosen identically from the saved per-window errors
    (as bench/selection.py reads them)."""
    value, report = importlib.import_module("value"), importlib.import_module("value_report")
    threads = torch.get_num_threads()
    try:
        cfg = {**VALUE, "datasets": ["stations"], "history_days": [14], "backbones": ["dlinear"], "seeds": [1],
               "learned": [*VALUE["learned"], report.POOLED], "combine": 1}
        runs = [run for job in value.jobs(cfg) for run in value.run_job(*job, 1)["runs"]]
    finally:
        torch.set_num_threads(threads)
    rows = report.summarize(runs, cfg)
    served = next(r for r in runs if r["method"] == report.SERVED)
    fedavg = next(r for r in runs if r["method"] == report.SERVED_FEDERATED)
    for client, scores in served["clients"].items():  # its own candidates only, every test window served
        assert set(scores["served"]) <= {"federated", "local", "median", *cfg["anchors"]}
        assert sum(scores["served"].values()) == pytest.approx(len(fedavg["clients"][client]["windows"]["test"]["mase"]))
    by = {r["method"]: r["mase"] for r in rows}
    scarce = report.verdicts(rows, cfg)["federated_pays_when_scarce"][0]  # beside what pooling the data would buy
    assert scarce["pooled_vs_local"] == pytest.approx(1 - by[report.POOLED] / by["local"])
    assert scarce["pooled_met"] == (scarce["pooled_vs_local"] >= 0.05 and scarce["pooled_vs_best_anchor"] >= 0.05)
    saved = tmp_path / "windows.npz"
    value.save_windows(runs, {"commit": "abc"}, saved)
    again, config = value.load_windows(saved)
    assert config == {"commit": "abc"} and len(again) == len(runs)
    replayed = value.served_runs([r for r in again if r["method"] != report.SERVED], cfg)
    assert [r["clients"] for r in replayed] == [r["clients"] for r in runs if r["method"] == report.SERVED]
    selection = importlib.import_module("selection")
    study = {r["rule"]: r for r in selection.study([r for r in again if r["method"] != report.SERVED])}
    product = next(r for r in rows if r["method"] == report.SERVED)
    assert study[selection.PRODUCT]["all"]["mase"] == pytest.approx(product["mase"])
    for key in ("worst_client_vs_best_anchor", "gateways_within_2pct", "worst_gateway_vs_val_anchor"):
        assert study[selection.PRODUCT]["all"][key] == pytest.approx(product[key]), key


def test_the_guarded_decay_rules_leave_the_best_anchor_only_for_a_clear_win() -> None:
    """bench/selection.py: under decay_14 a model 1% better than the best anchor is served; with a
    2% margin the anchor is, until the model is 10% better; the test-based guard does not follow a
    model that is ahead on the weighted mean through one lucky day."""
    selection = importlib.import_module("selection")
    origins, period = np.arange(0, 30 * 24, 6), 24
    at = int(origins.max()) + 2 * period
    rng = np.random.default_rng(3)
    anchor = 1.0 + 0.01 * rng.standard_normal(len(origins))

    def pick(rule: str, model: np.ndarray) -> str:
        errors = {"ets": anchor, "theta": anchor + 0.5, "median": model}
        return selection.RULES[rule](errors, origins, period, at, period, None)

    assert pick("decay_14", anchor * 0.99) == "median" and pick("decay_margin_2", anchor * 0.99) == "ets"
    assert pick("decay_margin_2", anchor * 0.9) == "median"
    lucky = np.where(origins >= at - 2 * period, anchor * 0.1, anchor * 1.005)  # far ahead on its latest day only
    assert pick("decay_14", lucky) == "median" and pick("decay_proven_1.0", lucky) == "ets"
    assert pick("decay_proven_1.0", anchor * 0.9) == "median"


def test_soak_checks_hold_the_runs_to_issue_27s_done_means() -> None:
    """Hostile round p99 at most 1.5x clean, no update lost, the store's last sample at most 1.25x
    its sample at half time; rate-limit rows count the messages they report as dropped."""
    soak = importlib.import_module("soak_measures")

    def run(p99: float | None, lost: int, store: list[float]) -> dict:
        return {"round_p99_s": p99, "updates_lost": lost, "store_mb": store}

    passed = soak.checks({"clean": run(4.0, 0, [1, 5, 8, 9, 10]), "hostile": run(6.0, 0, [1, 6, 9, 10, 11.2])})
    assert passed["all_ok"] and passed["round_p99"]["ratio"] == 1.5 and passed["store_flat_hostile"]["ratio"] == 1.244
    failed = soak.checks({"clean": run(4.0, 0, [1, 5, 8, 9, 10.1]), "hostile": run(6.1, 1, [1, 2, 3])})
    failing = [name for name, check in failed.items() if isinstance(check, dict) and not check["ok"]]
    assert failing == ["round_p99", "store_flat_clean", "updates_lost_hostile", "store_flat_hostile"]
    assert not failed["all_ok"] and not soak.checks({"clean": run(None, 0, [1]), "hostile": run(2, 0, [1])})["all_ok"]
    assert soak.quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and soak.quantile([], 0.99) is None
    assert soak.refused_by_code([{"code": "rate_limited", "reason": "120 hello messages over the rate limit"},
                                 {"code": "duplicate", "reason": "seen"}]) == {"duplicate": 1, "rate_limited": 120}


def test_time_to_value_serves_the_fleet_model_on_day_one_from_only_the_rows_a_newcomer_held() -> None:
    """A site joining a fleet (bench/time_to_value.py): on day 1, before any outcome is known,
    joined serves the fleet's model and alone an anchor; no forecast of day k uses a row the site
    did not hold by then (changing every row from day 3 on leaves days 1 and 2 as they were)."""
    ttv, joining, value = (importlib.import_module(name) for name in ("time_to_value", "joining", "value"))
    from datasets import dataset_tables

    cfg = {**ttv.QUICK, "datasets": ["homes"], "seeds": [1], "days": 4, "rounds": 1,
           "anchors": ["seasonal_naive", "window_average", "ets"]}
    threads = torch.get_num_threads()
    try:
        state = ttv.fleet_job("homes", 1, cfg, 1)["state"]
        result = ttv.newcomer_job("homes", 1, {1: state}, cfg, 1)
    finally:
        torch.set_num_threads(threads)
    run = result["runs"][0]
    assert run["joined"][0]["pick"] == "federated" and run["alone"][0]["pick"] == "seasonal_naive"
    assert len(run["joined"]) == len(run["alone"]) == 4
    assert all(np.isfinite(day["mase"]) for side in ("joined", "alone") for day in run[side])
    timeline = joining.Timeline(dataset_tables("homes")[1], ttv.fleet("homes")[1], value.model_config("dlinear", "homes"), 4)
    model = timeline.fleet_model(state, 1)
    before = {"ets": timeline.anchor_forecasts("ets"), "federated": timeline.model_forecasts(model)}
    timeline.rows[3 * timeline.period:] += 100.0
    after = {"ets": timeline.anchor_forecasts("ets"), "federated": timeline.model_forecasts(model)}
    held = timeline.day <= 2
    for name in before:
        np.testing.assert_array_equal(before[name][held], after[name][held])
        assert not np.allclose(before[name][~held], after[name][~held], equal_nan=True)
