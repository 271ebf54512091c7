"""A head-mode round's data, prepared in a process of its own just before the training process
(``edge_agent.training_child``) starts: the gateway's table as of now (pandas), split, scaled and
windowed as numpy arrays (``edge_agent.data.arrays``), and each anchor's forecasts over the
validation windows (statsforecast's ETS and Theta among them), which the training process's
serving selection scores (``edge_agent.selection``).

Why: pandas (with the pyarrow that statsforecast's dependencies install) and statsforecast cost
~200 MB of memory, torch ~240 MB; one after the other, a round's peak is the larger of the two
processes instead of their sum. The training process reads the arrays and imports neither pandas
nor statsforecast. The arrays and forecasts are what it computed itself before (the same
functions on the same table), so what it trains and serves does not change.

This module imports neither torch nor pandas: ``python -m edge_agent.round_data <job>`` reads a
``DataJob`` (JSON) and writes ``ROUND_DATA`` next to it (numpy's npz, no pickle)."""

from __future__ import annotations

import hashlib
import io
import logging
import resource
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.anchors import fitted_forecasts
from edge_agent.data.arrays import client_arrays
from edge_agent.live import gateway_table
from edge_agent.sensors.settings import SensorSettings
from edge_agent.storage import write_bytes_atomically
from edge_agent.toml_config import DataSource

if TYPE_CHECKING:
    from edge_agent.config import AgentConfig

MODE = "head"  # the learner mode whose data is prepared here (``HeadLearner.kind``); others read their table
DATA_JOB_FILE, ROUND_DATA = "data_job.json", "round_data.npz"
ANCHOR_PREFIX, PEAK = "anchor.", "peak_rss_mb"
ANCHOR_SPLITS = ("val", "test")  # the windows the serving selection scores every candidate on (KNOWN_SPLITS)
ANCHOR_CACHE, CACHE_KEY = "anchor_forecasts.npz", "key"  # in the state folder: the last round's anchors

log = logging.getLogger("edgefl.agent")


class DataJob(BaseModel):
    """Where the gateway's data lies (``AgentConfig``'s fields of the same names) and the windows
    its model reads: what ``edge_agent.learners.head_learner`` is given, prepared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    state_dir: Path
    data: DataSource
    sensors: SensorSettings | None = None
    interval_ns: int = Field(gt=0)
    lookback: int = Field(ge=1)
    horizon: int = Field(ge=1)
    stride: int = Field(ge=1)
    anchors: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: AgentConfig) -> DataJob:
        """The job of a head-mode agent's round."""
        return cls(client_id=cfg.client_id, state_dir=cfg.state_dir, data=cfg.data, sensors=cfg.sensors,
                   interval_ns=cfg.model.interval_ns, lookback=cfg.model.lookback, horizon=cfg.model.horizon, stride=cfg.training.stride,
                   anchors=cfg.training.anchors)


def prepare(job: DataJob) -> dict[str, np.ndarray]:
    """The round's arrays (``ClientArrays.to_npz``) and each anchor's forecasts over the validation
    and test windows (every outcome a live gateway's choice reads), fitted on the training rows
    (none for an anchor whose history is too short). The forecasts are the last round's
    (``ANCHOR_CACHE``) when the data they depend on has not changed since: ETS and Theta cost
    seconds a round, and a gateway's table changes at most once a step."""
    from edge_agent.data.table import check_interval  # pandas: loaded already with the table

    table = gateway_table(job)
    check_interval(table, job.interval_ns)
    arrays = client_arrays(table, job.lookback, job.horizon, job.stride)
    origins = {split: arrays.origins(split) for split in ANCHOR_SPLITS}
    key = anchor_key(job.anchors, arrays.period, arrays.history, arrays.raw, np.concatenate(list(origins.values())),
                     arrays.horizon)
    cache = job.state_dir / ANCHOR_CACHE
    forecasts = cached_anchors(cache, key)
    if forecasts is None:
        fitted: dict = {}
        forecasts = {}
        for split, at in origins.items():
            for name in job.anchors:
                values = fitted_forecasts(name, arrays.period, arrays.history, arrays.raw, at, arrays.horizon, fitted)
                if values is not None:
                    forecasts[anchor_key_name(split, name)] = values
        save_npz(cache, {**forecasts, CACHE_KEY: np.frombuffer(key, dtype=np.uint8)})
    return arrays.to_npz() | forecasts


def anchor_key(names: Sequence[str], period: int, history: np.ndarray, series: np.ndarray, origins: np.ndarray,
               horizon: int) -> bytes:
    """SHA-256 of everything an anchor's forecasts depend on (``fitted_forecasts``' arguments)."""
    digest = hashlib.sha256(repr((tuple(names), int(period), int(horizon))).encode())
    for values in (history, series, origins):
        array = np.ascontiguousarray(values)
        digest.update(repr((array.dtype.str, array.shape)).encode())
        digest.update(array.tobytes())
    return digest.digest()


def cached_anchors(path: Path, key: bytes) -> dict[str, np.ndarray] | None:
    """The forecasts saved at ``path`` when they were made for ``key``; None when there are none,
    they are for other data or the file cannot be read (then they are made again)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            if saved[CACHE_KEY].tobytes() != key:
                return None
            return {name: saved[name] for name in saved.files if name.startswith(ANCHOR_PREFIX)}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        log.warning("%s: unreadable (%s); the anchors' forecasts are made again", path, err)
        return None


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``arrays`` as an npz at ``path``, written atomically (no pickle)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomically(path, buffer.getvalue())


def anchor_memo(npz: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[tuple[str, str], np.ndarray | None]:
    """The anchors' forecasts ``prepare`` made, as ``ClientData.memo`` entries (None: too little history)."""
    return {(name, split): npz[anchor_key_name(split, name)] if anchor_key_name(split, name) in npz else None
            for split in ANCHOR_SPLITS for name in names}


def anchor_key_name(split: str, name: str) -> str:
    """The npz key of anchor ``name``'s forecasts over ``split``."""
    return f"{ANCHOR_PREFIX}{split}.{name}"


def peak_rss_mb() -> float:
    """This process's peak resident memory: ``VmHWM`` of its own address space (``ru_maxrss``
    would count the agent's size at the fork before ``exec``), ``ru_maxrss`` where /proc is absent."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def main(job_path: Path) -> None:
    """The process: prepare the job's round and write it, with this process's peak memory, next to the job."""
    prepared = prepare(DataJob.model_validate_json(job_path.read_bytes()))
    save_npz(job_path.parent / ROUND_DATA, {**prepared, PEAK: np.array(round(peak_rss_mb(), 1))})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
