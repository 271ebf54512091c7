"""The pictures ``edgefl demo`` leaves: the rounds' training loss beside the fleet's validation
MASE, and each station's last test days, measured against the forecast of the model it serves
(restored from the agent's state folder by ``edge_agent.forecast.restored``, the path of
``edgefl agent forecast``). Each PNG names its panels in its ``Description`` text chunk."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgefl.demo import RoundRow

COLUMN = "temp_air"  # measured at every bundled site, and readable at a glance
COLUMN_LABEL = "air temperature (°C)"
DAYS = 2  # test windows drawn per station, one horizon (a day) apart


@dataclass(frozen=True)
class StationDays:
    """One station's last test days of ``COLUMN``: the hours, what was measured, what the
    served candidate forecast a horizon ahead (data units), and which candidate that is."""

    site: str
    hours: np.ndarray
    measured: np.ndarray
    forecast: np.ndarray
    served: str


def _pyplot():
    """matplotlib's pyplot on the file-only backend (the demo may run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curve(rows: list[RoundRow], path: Path) -> None:
    """Two panels over the rounds: the training loss (sample-weighted over the agents' updates) and the
    fleet's mean validation MASE of the federated model and of what the agents serve."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    fig, (loss, val) = plt.subplots(1, 2, figsize=(9, 3.4))
    rounds = [r.round for r in rows]
    loss.plot(rounds, [r.loss for r in rows], marker="o")
    loss.set(xlabel="round", ylabel="training loss (normalized)", title="training loss")
    val.plot(rounds, [r.val_federated for r in rows], marker="o", label="federated model")
    val.plot(rounds, [r.val_served for r in rows], marker="s", label="what each station serves")
    val.set(xlabel="round", ylabel="validation MASE (mean of stations)", title="validation, at the round's start")
    val.legend()
    for ax in (loss, val):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"edgefl demo: {rows[0].clients if rows else 0} weather stations")
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Description": "panels: training loss, validation MASE"})
    plt.close(fig)


def station_days(config: Path) -> StationDays:
    """The last ``DAYS`` day-ahead test windows (one horizon apart) of the agent of ``config``, as
    its state folder has it: measured ``COLUMN`` and the forecast of the candidate it serves."""
    import torch

    from edge_agent.config import AgentConfig
    from edge_agent.forecast import restored
    from edge_agent.live import gateway_table
    from edge_agent.toml_config import load_config

    cfg = load_config(config, AgentConfig)
    table = gateway_table(cfg)
    learner, served = restored(cfg, table)
    data, horizon = learner.data, cfg.model.horizon
    origins = data.test.origins()
    chosen = np.flatnonzero(np.isin(origins, origins[-1] - horizon * np.arange(DAYS)))
    memo = {key: value for key, value in data.memo.items() if key[1] != "test"}  # anchors stay fitted
    last = replace(data, test=replace(data.test, starts=data.test.starts[chosen]), memo=memo)
    batches = served.current_batches(last, "test")  # what it serves now
    forecast, target = (torch.cat(parts) for parts in zip(*batches))
    column, first = data.columns.index(COLUMN), table.n_rows - len(data.raw)  # origins count from data.raw's first row
    hours = np.concatenate([table.index[first + o: first + o + horizon] for o in origins[chosen]])
    return StationDays(cfg.client_id, hours, data.scaler.inverse_transform(target.numpy())[..., column].ravel(),
                       data.scaler.inverse_transform(forecast.numpy())[..., column].ravel(), served.label)


def plot_forecasts(stations: list[StationDays], path: Path) -> None:
    """One panel per station: its last ``DAYS`` test days, measured against its served forecast."""
    plt = _pyplot()
    rows = (len(stations) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 2.4 * rows), squeeze=False)
    for ax, station in zip(axes.flat, stations):
        ax.plot(station.hours, station.measured, color="black", label="measured")
        ax.plot(station.hours, station.forecast, color="tab:orange", label="forecast, a day ahead")
        ax.set_title(f"{station.site} (serves {station.served})", fontsize=9)
        ax.set_ylabel(COLUMN_LABEL, fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(stations):]:
        ax.remove()
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"edgefl demo: each station's last {DAYS} test days")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Description": "panels: " + ", ".join(s.site for s in stations)})
    plt.close(fig)
