"""Every model the product trains exports to ONNX and runs at any batch size (issue 44): the export
matrix of ``export.matrix`` with ONNX Runtime's speed-up over torch at batch 1.

Every backbone x projection (channel, qap, linear) x head (shared, personal) x point or quantile
forecasts, with the recipe's other settings (seasonal base included), trained a few steps on the
bundled Amsterdam weather, BatchNorm statistics from its training windows; ``edgefl export onnx``'s
exporter writes and verifies it on 11 windows, and ``model.onnx`` runs in ONNX Runtime at batch
1, 7 and 32 against torch (largest forecast difference, spikes identical, no constant shaped by
the export batch). A cell the config or the exporter refuses gives its one-line reason. Timings
(median of 20 runs of one window) use the pinned AVX2 kernels (``bench/common.py``) and the
workers' share of the cores: at the default two workers on two cores one torch thread each (with
two threads on busy cores torch's threads wait on each other, and its time says more about the
machine's load than about the model). Usage:

    python bench/export_matrix.py --quick   # tiny sizes (the test's), a few minutes on 2 cores
    python bench/export_matrix.py           # the backbones' own sizes at the recipe's d_qap
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from common import bench_parser, commit, configure, run_config, run_parallel, save_figure, write_report

QUICK = {"sizes": "tiny"}
FULL = {"sizes": "backbone defaults"}


def sizes_of(cfg: dict) -> dict[str, int]:
    """The model sizes of a mode: ``export.matrix.TINY``, or only its windows (lookback, horizon),
    every other size the backbone's own default and the recipe's."""
    from export.matrix import TINY

    return TINY if cfg["sizes"] == "tiny" else {"lookback": TINY["lookback"], "horizon": TINY["horizon"]}


def run_job(backbone: str, cfg: dict, threads: int) -> dict:
    """Every cell of one backbone, checked and timed."""
    import torch

    from export.matrix import cells, check, matrix_data

    torch.set_num_threads(threads)
    started, data = time.perf_counter(), matrix_data()
    rows = []
    for cell in (cell for cell in cells() if cell.backbone == backbone):
        with tempfile.TemporaryDirectory() as folder:
            rows.append(check(cell, data, Path(folder), sizes_of(cfg), timed=True))
    return {"backbone": backbone, "cells": rows, "seconds": round(time.perf_counter() - started, 1)}


def label(row: dict) -> str:
    return f"{row['backbone']} {row['projection']} {row['head']} {'quantiles' if row['quantiles'] else 'point'}"


def markdown(summary: dict) -> str:
    cells, cfg = summary["cells"], summary["config"]
    exported = [row for row in cells if row["exported"]]
    lines = [f"Export matrix at {cfg['sizes']} sizes, commit {summary['commit']}: {len(exported)} of {len(cells)} "
             f"cells exported, every one run in ONNX Runtime at batch 1, 7 and 32 against torch; "
             f"{sum(row['batch_sizes_ok'] for row in exported)} passed the export's own check at every batch, "
             f"{sum(row['spikes_identical'] is True for row in exported)} of "
             f"{sum(row['spikes_identical'] is not None for row in exported)} spiking ones with every spike identical, "
             f"{sum(bool(row['baked']) for row in exported)} with a constant shaped by the export batch; NIR and "
             f"Lava netx of the on-chip stack (read back and simulated against the model): "
             f"{sum(row.get('neuromorphic', {}).get('nir') == 'exported' for row in exported)} and "
             f"{sum(row.get('neuromorphic', {}).get('lava') == 'exported' for row in exported)} of "
             f"{sum('neuromorphic' in row for row in exported)} spiking cells.", "",
             "| cell | exported | max abs diff | spikes identical | batches 1, 7, 32 | ORT speed-up at batch 1 | NIR | Lava |",
             "|---|---|---|---|---|---|---|---|"]
    for row in cells:
        if row["exported"]:
            spikes = "-" if row["spikes_identical"] is None else "yes" if row["spikes_identical"] else "**no**"
            chip = row.get("neuromorphic", {})
            lines.append(f"| {label(row)} | yes | {row['max_abs_diff']:.2e} | {spikes} | "
                         f"{'ok' if row['batch_sizes_ok'] else '**failed**'} | {row['ort_speedup_batch1']:.1f}x | "
                         f"{chip.get('nir', '-')} | {chip.get('lava', '-')} |")
        else:
            lines.append(f"| {label(row)} | no: {row['reason']} | | | | | | |")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in summary["cells"] if row["exported"]]
    fig, ax = plt.subplots(figsize=(8, 0.22 * len(rows) + 1))
    ax.barh([label(row) for row in rows], [row["ort_speedup_batch1"] for row in rows], color="tab:blue")
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("torch time / ONNX Runtime time, one window")
    ax.tick_params(axis="y", labelsize=6)
    ax.invert_yaxis()
    save_figure(fig, path)


def main() -> None:
    from edge_agent.models import BACKBONES

    parser = bench_parser(__doc__, "tiny models (the sizes tests/test_export_matrix.py checks)")
    args, cfg, started = configure(parser, QUICK, FULL)
    jobs = run_parallel(run_job, [(backbone, cfg) for backbone in sorted(BACKBONES)], args.workers,
                        lambda r: f"{r['backbone']:>12}: {sum(c['exported'] for c in r['cells'])} of "
                                  f"{len(r['cells'])} cells exported ({r['seconds']} s)")
    summary = {"commit": commit(), "cells": [row for job in jobs for row in job["cells"]],
               "config": run_config(cfg, args.quick, started)}
    write_report(args.out, "export_matrix", summary, markdown, plot)


if __name__ == "__main__":
    main()
