"""What every benchmark script shares: the repository on the path and a spawn-based job pool."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Pinned math: MKL, oneDNN and ATen pick their kernels by the CPU, and an AVX-512 kernel sums in
# another order than an AVX2 one; over a training run the last bits grow into per-client MASE
# differences of up to 0.07 (bench/value.py, same commit and seeds, two machines). Pinned to the
# AVX2 paths before torch is imported, here and in the job workers (spawned: they inherit the
# environment); a run keeps any value set by hand. The pin gives the same numbers on the same CPU
# model, run after run, but not across CPU models: MKL's AVX2 branch still differs in the last
# bits between them (value_sealed.json at 6a6d134 and ac52fc8: learned cell means within 0.94%,
# median 0.005%). So every results file names its CPU (``cpu_model``).
PORTABLE_MATH = {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
NATIVE = "EDGEFL_BENCH_NATIVE_KERNELS"  # set in a child that measures speed (native_environment)
if not os.environ.get(NATIVE):
    for _name, _value in PORTABLE_MATH.items():
        os.environ.setdefault(_name, _value)
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def native_environment() -> dict[str, str]:
    """The environment of a child process that times torch: the CPU's own kernels. The AVX2 pin
    gives the same numbers everywhere, but it slows torch's large matrix products on an AVX-512
    CPU (iTransformer at batch 32: about 1.5x) and not ONNX Runtime's, which would flatter ONNX
    Runtime in a speed ratio."""
    env = {name: value for name, value in os.environ.items() if name not in PORTABLE_MATH}
    return {**env, NATIVE: "1"}


def run_parallel(
    job: Callable[..., dict], arguments: Sequence[tuple], workers: int, describe: Callable[[dict], str]
) -> list[dict]:
    """Run ``job(*args, threads)`` for every args tuple over spawned workers (fork after torch
    threads can hang), with a progress bar and one line per finished job; results in the order
    of ``arguments``, so a summary does not depend on which worker finished first."""
    from rich.progress import Progress

    threads = max(1, (os.cpu_count() or 1) // max(workers, 1))
    results: list[dict | None] = [None] * len(arguments)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool, Progress() as bar:
        task = bar.add_task("benchmark jobs", total=len(arguments))
        futures = {pool.submit(job, *args, threads): index for index, args in enumerate(arguments)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            bar.console.print(describe(results[futures[future]]))
            bar.advance(task)
    return [result for result in results if result is not None]


def write_report(
    out: Path, name: str, summary: dict, markdown: Callable[[dict], str], plot: Callable[[dict, Path], None]
) -> None:
    """``<name>.json``, ``.md`` and ``.png`` under ``out``; prints the table and where it went."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (out / f"{name}.md").write_text(table)
    plot(summary, out / f"{name}.png")
    print(table)
    print(f"wrote {out / name}.json, {name}.md, {name}.png in {summary['config']['wall_seconds']} s")


def bench_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --quick, --workers and --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser


def configure(parser: argparse.ArgumentParser, quick: dict, full: dict) -> tuple[argparse.Namespace, dict, float]:
    """Parsed arguments, a copy of the quick or full settings, and the start time of the run."""
    import time

    args = parser.parse_args()
    return args, dict(quick if args.quick else full), time.perf_counter()


def run_config(cfg: dict, quick: bool, started: float) -> dict:
    """The ``config`` block of every results file: the settings, the mode, what it took, the CPU
    it ran on and the commit (``+dirty`` when the tree had uncommitted changes)."""
    import time

    return {**cfg, "mode": "quick" if quick else "full", "wall_seconds": round(time.perf_counter() - started, 1),
            "cpu_count": os.cpu_count(), "cpu_model": cpu_model(), "commit": commit()}


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo, else the platform's word): learned numbers
    reproduce to the last digit on the same model only (see ``PORTABLE_MATH``)."""
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def commit() -> str:
    """The repository's HEAD commit, with ``+dirty`` when tracked files differ from it."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def panel_row(count: int, width: float):
    """A figure of one row of ``count`` panels, each ``width`` inches wide, drawn headless; and its axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, count, figsize=(width * count, 3.4), squeeze=False)
    return fig, axes[0]


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def capped_stride(rows: int, lookback: int, horizon: int, max_windows: int) -> int:
    """The stride between training windows that leaves at most ``max_windows`` of them in
    ``rows`` rows, so every history length costs about the same to train on."""
    return max(1, -(-(rows - lookback - horizon + 1) // max_windows))


from edge_agent.recipe import ANCHORS  # noqa: E402  (the repository is on the path from here on)


def anchor_scores(clients: Sequence, names: Sequence[str] = ANCHORS) -> dict[str, dict | None]:
    """Every anchor's test MASE, MSE and MAE on a benchmark's own clients and windows, weighted by
    training windows like the benchmarks' methods (None: some client's history is too short for it)."""
    from edge_agent.selection import anchor_metrics
    from edge_agent.train import weighted_metrics

    out: dict[str, dict | None] = {}
    for name in names:
        per_client = [anchor_metrics(c, name, "test") for c in clients]
        if any(m is None for m in per_client):
            out[name] = None
            continue
        fleet = weighted_metrics(per_client, [c.n_train for c in clients])
        out[name] = {"mase": fleet.mase, "mse": fleet.mse, "mae": fleet.mae}
    return out


def anchor_lines(anchors: dict[str, dict | None]) -> list[str]:
    """The anchors as a markdown table, for a benchmark's report."""
    lines = ["| anchor (fitted on each client's own history) | MASE | MSE | MAE |", "|---|---|---|---|"]
    for name, s in anchors.items():
        lines.append(f"| {name} | " + (" | ".join(f"{s[k]:.4f}" for k in ("mase", "mse", "mae")) if s
                                       else "needs more history | - | -") + " |")
    return lines
