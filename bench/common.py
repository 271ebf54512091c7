"""What every benchmark script shares: the repository on the path and a spawn-based job pool."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run_parallel(
    job: Callable[..., dict], arguments: Sequence[tuple], workers: int, describe: Callable[[dict], str]
) -> list[dict]:
    """Run ``job(*args, threads)`` for every args tuple over spawned workers (fork after torch
    threads can hang), printing one progress line per finished job; results in finishing order."""
    threads = max(1, (os.cpu_count() or 1) // max(workers, 1))
    results = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(job, *args, threads) for args in arguments]
        for done, future in enumerate(as_completed(futures), 1):
            results.append(future.result())
            print(f"[{done}/{len(futures)}] {describe(results[-1])}", flush=True)
    return results
