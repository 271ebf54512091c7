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

import io
import resource
import sys
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
ANCHOR_SPLIT = "val"  # the windows the serving selection scores every candidate on


class DataJob(BaseModel):
    """Where the gateway's data lies (``AgentConfig``'s fields of the same names) and the windows
    its model reads: what ``edge_agent.learners.head_learner`` is given, prepared."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    client_id: str
    state_dir: Path
    data: DataSource
    sensors: SensorSettings | None = None
    lookback: int = Field(ge=1)
    horizon: int = Field(ge=1)
    stride: int = Field(ge=1)
    anchors: tuple[str, ...] = ()

    @classmethod
    def of(cls, cfg: AgentConfig) -> DataJob:
        """The job of a head-mode agent's round."""
        return cls(client_id=cfg.client_id, state_dir=cfg.state_dir, data=cfg.data, sensors=cfg.sensors,
                   lookback=cfg.model.lookback, horizon=cfg.model.horizon, stride=cfg.training.stride,
                   anchors=cfg.training.anchors)


def prepare(job: DataJob) -> dict[str, np.ndarray]:
    """The round's arrays (``ClientArrays.to_npz``) and each anchor's validation forecasts, fitted
    on the training rows (none for an anchor whose history is too short)."""
    arrays = client_arrays(gateway_table(job), job.lookback, job.horizon, job.stride)
    fitted: dict = {}
    forecasts = {name: fitted_forecasts(name, arrays.period, arrays.history, arrays.raw, arrays.origins(ANCHOR_SPLIT),
                                        arrays.horizon, fitted) for name in job.anchors}
    return arrays.to_npz() | {ANCHOR_PREFIX + name: values for name, values in forecasts.items() if values is not None}


def anchor_memo(npz: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[tuple[str, str], np.ndarray | None]:
    """The anchors' forecasts ``prepare`` made, as ``ClientData.memo`` entries (None: too little history)."""
    return {(name, ANCHOR_SPLIT): npz[ANCHOR_PREFIX + name] if ANCHOR_PREFIX + name in npz else None
            for name in names}


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
    buffer = io.BytesIO()
    np.savez(buffer, **prepared, **{PEAK: np.array(round(peak_rss_mb(), 1))})
    write_bytes_atomically(job_path.parent / ROUND_DATA, buffer.getvalue())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
