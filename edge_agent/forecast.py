"""Forecasts on the gateway: the agent's own model (its personal part and the last global state,
as the agent saved them) on its latest local window, in torch or in ONNX Runtime; or, while the
gateway's history is too short to train on or nothing is trained yet, the foundation model alone
(zero-shot, ``edge_agent.zero_shot``) where one is configured."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_agent.anchors import make_anchor, short_history_forecast
from edge_agent.config import AgentConfig
from edge_agent.conformal import apply_offsets
from edge_agent.data import (ClientData, DataError, SeriesTable, WindowSet, prepare_client, sampling_step, steps_per_day,
                             time_features)
from edge_agent.learners import HeadLearner, make_learner, training_rows_needed
from edge_agent.live import gateway_table
from edge_agent.models import Forecaster
from edge_agent.models.foundation import load_foundation
from edge_agent.onnx_model import OnnxForecaster
from edge_agent.recipe import ANCHORS as RECIPE_ANCHORS
from edge_agent.models.combination import median_forecast
from edge_agent.newcomer import FLEET, Newcomer, newcomer_forecast, received_model
from edge_agent.selection import MEAN_OF_BEST, MEDIAN, Served, present, select
from edge_agent.serving.onnx_serving import floored, never_negative
from edge_agent.state import AgentState
from edge_agent.train import conformal_offsets
from edge_agent.zero_shot import zero_shot_forecast

log = logging.getLogger("edgefl.agent")


def load_local_model(cfg: AgentConfig, table: SeriesTable) -> Forecaster:
    """The model the agent serves, with its personal (and last global) parameters restored from disk
    (where an anchor serves: the agent's federated model, the model an export can describe)."""
    learner, served = restored(cfg, table)
    return served.model if served.model is not None else learner.model


def serving(cfg: AgentConfig, table: SeriesTable) -> Served:
    """What the agent serves now: its federated model, or where it validates better its local-only
    model (``keep_local``) or an anchor (``anchors``; see ``HeadLearner.serving_model``)."""
    return restored(cfg, table)[1]


def restored(cfg: AgentConfig, table: SeriesTable) -> tuple[HeadLearner, Served]:
    """The agent's head learner as saved on disk, and what it serves."""
    learner = make_learner(cfg, table)
    if not isinstance(learner, HeadLearner):
        raise ValueError(f"mode {cfg.mode!r}: local forecasts and exports need a head-mode agent")
    state = AgentState(cfg.state_dir)
    return learner, state.restore(learner).serving_model(state.trained_round() + 1)


@dataclass(frozen=True)
class Forecast:
    """The next ``horizon`` steps in the data's own units and which model made them; a quantile
    model's forecast also has every level and says what its interval is."""

    stamps: list[str]
    columns: list[str]
    values: torch.Tensor  # (H, F): the point forecast, a quantile model's median
    model: str  # "federated", "local", an anchor's name, the ONNX file or "zero-shot foundation (why)"
    zero_shot: bool = False
    anchor: str = ""  # why an anchor serves (validated best, or too little history to train)
    levels: tuple[float, ...] = ()
    quantiles: torch.Tensor | None = None  # (H, F, Q), ordered like ``levels``
    interval: str = ""  # what the interval is, or why there is none
    note: str = ""  # why a model serves, where there is more to say than its name

    @property
    def served_by(self) -> str:
        """Which model made the forecast, as a phrase: "the federated model", "the ets anchor (...)",
        "zero-shot foundation (...)"."""
        if self.zero_shot:
            return self.model
        if self.anchor:
            return f"the {self.model} anchor ({self.anchor})"
        return f"the {self.model} model ({self.note})" if self.note else f"the {self.model} model"

    def csv_lines(self) -> list[str]:
        """CSV: ``time``, then per feature its point forecast and every other level (``<feature>_q0.1``)."""
        others = [j for j, level in enumerate(self.levels) if level != 0.5]
        header = [name for column in self.columns
                  for name in (column, *(f"{column}_q{self.levels[j]:g}" for j in others))]
        lines = [",".join(["time", *header])]
        for h, stamp in enumerate(self.stamps):
            row = [v for f in range(len(self.columns)) for v in (self.values[h, f], *self._quantiles(h, f, others))]
            lines.append(",".join([stamp, *(f"{float(v):.6g}" for v in row)]))
        return lines

    def cells(self, step: int) -> list[str]:
        """One horizon step as table cells, per feature "3.100", or "3.100 [2.550, 3.980]" with the
        interval (lowest and highest level)."""
        cells = []
        for f in range(len(self.columns)):
            bounds = self._quantiles(step, f, [0, -1])
            interval = f" [{bounds[0]:.3f}, {bounds[1]:.3f}]" if bounds else ""
            cells.append(f"{float(self.values[step, f]):.3f}{interval}")
        return cells

    def _quantiles(self, step: int, feature: int, which: list[int]) -> list[float]:
        """The quantiles at positions ``which`` of one step and feature; none for a point forecast."""
        return [] if self.quantiles is None else [float(self.quantiles[step, feature, j]) for j in which]


@torch.no_grad()
def forecast(cfg: AgentConfig, onnx_model: Path | None = None, conformal: bool = False) -> Forecast:
    """Forecast the horizon after the latest window of local data, in the data's own units,
    with the served torch model or, given ``onnx_model`` (an ``edgefl export onnx`` model.onnx),
    ONNX Runtime; without a model of the gateway's own (see ``no_model_yet``) with the zero-shot
    foundation, where one is configured (point forecasts only). A quantile model's interval is its
    own lowest to highest quantile or, with ``conformal``, that interval calibrated on the
    gateway's validation windows by the same model (``conformal_interval``). A feature that was
    never negative in the history is not forecast below 0 (as the serving path does)."""
    table = gateway_table(cfg)
    made = _forecast(cfg, table, onnx_model, conformal)
    non_negative = never_negative(table.values)
    quantiles = None if made.quantiles is None else torch.from_numpy(floored(made.quantiles.numpy(), non_negative))
    return replace(made, values=torch.from_numpy(floored(made.values.numpy(), non_negative)), quantiles=quantiles)


def _forecast(cfg: AgentConfig, table: SeriesTable, onnx_model: Path | None, conformal: bool) -> Forecast:
    """``forecast`` on ``table`` before any floor."""
    needed = training_rows_needed(cfg)
    why, checkpoint = no_model_yet(cfg, table, needed), zero_shot_checkpoint(cfg)
    if why and checkpoint and onnx_model is None:
        return _zero_shot(cfg, table, checkpoint, why, conformal)
    if table.n_rows < needed:
        if onnx_model is not None:
            raise DataError(f"{table.name}: {why}; an ONNX model needs that much history too")
        return _short_history(cfg, table, why)
    if conformal and not cfg.model.quantiles:
        raise ValueError("conformal calibration is of quantile intervals; this agent's model forecasts points "
                         "(set model.quantiles, e.g. [0.1, 0.5, 0.9])")
    if not table.present[-cfg.model.lookback :].all():
        raise ValueError(f"{table.name}: the latest {cfg.model.lookback} steps have a gap; no forecast from them")
    data = prepare_client(table, cfg.model.lookback, cfg.model.horizon)
    series = torch.from_numpy(data.scaler.transform(table.values[-cfg.model.lookback :]).astype("float32")[None])
    marks = torch.from_numpy(time_features(table.index[-cfg.model.lookback :])[None])
    served = None if onnx_model is not None else _untrained(cfg, table, data) if why else serving(cfg, table)
    reason = f"{why}; best on validation" if why else "best on validation"
    if served is not None and served.is_anchor:
        return _anchor(cfg, table, data, served, reason)
    if served is not None and served.which in (MEDIAN, MEAN_OF_BEST):
        return _combined(cfg, table, data, served, series, marks, reason)
    model, which = _model(served, cfg, onnx_model)
    stamps, note = next_stamps(table, cfg.model.horizon), f"{reason}, MASE {_scores(served)}" if why else ""
    if not cfg.model.quantiles:
        values = torch.as_tensor(data.scaler.inverse_transform(model(series, marks)[0].numpy()))
        return Forecast(stamps, list(data.columns), values, which, note=note)
    quantiles, interval = conformal_interval(model, series, marks, data.val if conformal else None)
    quantiles = data.scaler.inverse_transform(quantiles.movedim(-1, 0)).movedim(0, -1)
    return Forecast(stamps, list(data.columns), quantiles[..., cfg.model.median_index], which,
                    levels=cfg.model.quantiles, quantiles=quantiles, interval=interval, note=note)


def _untrained(cfg: AgentConfig, table: SeriesTable, data: ClientData) -> Served:
    """What a gateway with history but no model of its own serves, by the agent's rule on its
    validation windows: the anchors and, where one was received, the fleet's model (never a model
    nobody trained)."""
    fleet, training = fleet_model(cfg, table), cfg.training
    anchors = training.anchors or RECIPE_ANCHORS
    log.info("%s: no model trained yet; scoring %s on %d validation windows to choose what to serve",
             cfg.client_id, ", ".join([*([FLEET] if fleet else []), *anchors]), len(data.val))
    return select(data, {} if fleet is None else {FLEET: fleet}, anchors, training.median, training.selection_days,
                  present(data), training.combine)


def _model(served: Served | None, cfg: AgentConfig, onnx_model: Path | None) -> tuple[nn.Module, str]:
    """The served torch model and which it is, or ``onnx_model`` in ONNX Runtime and its path."""
    if served is not None:
        return served.model.eval(), served.which
    return OnnxForecaster(Path(onnx_model), cfg.model.quantiles, cfg.model.horizon), str(onnx_model)


def _anchor(cfg: AgentConfig, table: SeriesTable, data: ClientData, served: Served, reason: str) -> Forecast:
    """The anchor that validated best, fitted on the gateway's training rows and run over its whole history."""
    values = _anchor_values(served.which, data, cfg.model.horizon)
    return Forecast(next_stamps(table, cfg.model.horizon), list(data.columns), torch.as_tensor(values), served.which,
                    anchor=f"{reason}, MASE {_scores(served)}", interval=_points_only(cfg, "an anchor"))


def _combined(cfg: AgentConfig, table: SeriesTable, data: ClientData, served: Served, series: torch.Tensor,
              marks: torch.Tensor, reason: str) -> Forecast:
    """The median of every candidate, or the mean of the best few (one of which may be that
    median), in the data's units (both commute with the per-feature scaling of the models' inputs)."""
    def values(name: str, model: nn.Module | None) -> torch.Tensor:
        if name == MEDIAN:
            return median_forecast(torch.stack([values(n, m) for n, m in served.candidates.items()]))
        return torch.as_tensor(_anchor_values(name, data, cfg.model.horizon) if model is None else
                               data.scaler.inverse_transform(model.eval()(series, marks)[0].numpy()), dtype=torch.float64)

    picks = served.picks or (served.which,)
    combined = torch.stack([values(name, served.candidates.get(name)) for name in picks]).mean(dim=0)
    parts = [f"mean of {', '.join(picks)}"] if len(picks) > 1 else []
    what = "; ".join(parts + ([f"median of {', '.join(served.candidates)}"] if MEDIAN in picks else []))
    return Forecast(next_stamps(table, cfg.model.horizon), list(data.columns), combined, served.which,
                    anchor=f"{what}; {reason}, MASE {_scores(served)}", interval=_points_only(cfg, "a combination"))


def _anchor_values(name: str, data: ClientData, horizon: int) -> np.ndarray:
    """Anchor ``name`` fitted on the gateway's training rows, forecasting after its whole history (H, F)."""
    return make_anchor(name, data.period).fit(data.history).forecast(data.raw, np.array([len(data.raw)]), horizon)[0]


def _scores(served: Served) -> str:
    return ", ".join(f"{name} {score:.4f}" for name, score in served.scores.items() if np.isfinite(score))


def _short_history(cfg: AgentConfig, table: SeriesTable, why: str) -> Forecast:
    """Too little history to train: once a day is held and the fleet's model has arrived, the
    fleet's model, an anchor or their median by the product's rule (``edge_agent.newcomer``);
    before, the best anchor the gateway can fit. Either says so."""
    anchors, period, horizon = tuple(cfg.training.anchors or RECIPE_ANCHORS), steps_per_day(table), cfg.model.horizon
    fleet = fleet_model(cfg, table)
    if fleet is None or table.n_rows < period:
        name, values, how = short_history_forecast(table.values, period, horizon, anchors)
        return Forecast(next_stamps(table, horizon), list(table.columns), torch.as_tensor(values), name,
                        anchor=f"{why}; {how}", interval=_points_only(cfg, "an anchor"))
    newcomer = Newcomer(table.values, table.index[0], sampling_step(table), period, cfg.model.lookback, horizon)
    which, values, scores = newcomer_forecast(newcomer, fleet, anchors, cfg.training.selection_days,
                                             cfg.training.median, cfg.training.combine)
    known = ", ".join(f"{name} {score:.4f}" for name, score in scores.items() if np.isfinite(score))
    how = (f"{why}; the fleet's model, an anchor or their median, on its own days (MASE: {known})" if known else
           f"{why}; the fleet's model while no outcome of its own is known")
    stamps, columns = next_stamps(table, horizon), list(table.columns)
    if which == FLEET:
        return Forecast(stamps, columns, torch.as_tensor(values), FLEET, note=how, interval=_points_only(cfg, "the fleet's model on a short history"))
    return Forecast(stamps, columns, torch.as_tensor(values), which, anchor=how, interval=_points_only(cfg, "an anchor"))


def fleet_model(cfg: AgentConfig, table: SeriesTable) -> Forecaster | None:
    """The fleet's model as the agent last received it, in a model of the gateway's features: a
    head-mode fleet whose head is shared too (a personal head is the gateway's own to train); None
    where none was received."""
    if cfg.mode != HeadLearner.kind or cfg.model.head != "shared":
        return None
    state = AgentState(cfg.state_dir).fleet_state()
    if state is None:
        return None
    return received_model(cfg.model, table.n_features, state, cfg.seed, cfg.client_index)


def _points_only(cfg: AgentConfig, what: str) -> str:
    """What a point forecast says where the agent's model has quantiles."""
    return f"point forecast only: {what} predicts no quantiles" if cfg.model.quantiles else ""


def conformal_interval(model: nn.Module, series: torch.Tensor, marks: torch.Tensor,
                       calibration: WindowSet | None) -> tuple[torch.Tensor, str]:
    """A quantile model's forecast (H, F, Q) of one window, scaled like its input, and what its
    interval is; with ``calibration`` windows the outer levels are moved by split-conformal offsets
    fitted there (``edge_agent.conformal``), so that the interval covers at least the nominal share
    (highest - lowest level) of targets exchangeable with those windows' targets."""
    levels = model.levels
    quantiles = model.forward_quantiles(series, marks)[0]
    interval = f"{levels[-1] - levels[0]:.0%} interval (q{levels[0]:g}-q{levels[-1]:g})"
    if calibration is None:
        return quantiles, f"{interval}, the model's own quantiles (not calibrated)"
    calibrated = apply_offsets(quantiles, conformal_offsets(model, calibration))
    return calibrated, f"{interval}, conformal-calibrated on {len(calibration)} validation windows"


def no_model_yet(cfg: AgentConfig, table: SeriesTable, needed: int) -> str | None:
    """Why the gateway has no model of its own to serve (too little history to train on, or no
    trained state yet), or None when it has one."""
    if table.n_rows < needed:
        return f"{table.n_rows} rows of history; local training needs {needed}"
    if not AgentState(cfg.state_dir).has_trained_model():
        return f"no model trained yet in {cfg.state_dir}"
    return None


def zero_shot_checkpoint(cfg: AgentConfig) -> tuple[Path, str | None] | None:
    """The foundation checkpoint (and expected hash) for zero-shot forecasts: prompt mode's own
    foundation, head mode's ``zero_shot_foundation``; None where head mode names none."""
    if cfg.mode == "prompt":
        return cfg.foundation, cfg.foundation_sha256
    if cfg.zero_shot_foundation is None:
        return None
    return cfg.zero_shot_foundation, cfg.zero_shot_foundation_sha256


def _zero_shot(cfg: AgentConfig, table: SeriesTable, checkpoint: tuple[Path, str | None], why: str,
               conformal: bool) -> Forecast:
    """The foundation model's forecast alone, for the agent's horizon: point values, saying so
    where the agent's model has quantiles or a calibrated interval was asked for."""
    horizon = cfg.prompt.horizon if cfg.mode == "prompt" else cfg.model.horizon
    values = torch.as_tensor(zero_shot_forecast(load_foundation(*checkpoint), table, horizon))
    asked = conformal or (cfg.mode == "head" and cfg.model.quantiles)
    interval = "point forecast only: the zero-shot foundation predicts no quantiles" if asked else ""
    return Forecast(next_stamps(table, horizon), list(table.columns), values, f"zero-shot foundation ({why})", True,
                    interval=interval)


def next_stamps(table: SeriesTable, horizon: int) -> list[str]:
    """The ``horizon`` timestamps after the table's last row, at its last step."""
    step = table.index[-1] - table.index[-2]
    return [str(table.index[-1] + step * (h + 1)) for h in range(horizon)]
