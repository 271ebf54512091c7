"""One site's first days after joining (bench/time_to_value.py): every candidate's forecast of
every origin of days 1..D, each made with only the rows the site held by then
(``edge_agent.newcomer.Newcomer``), the daily choice among them by the product's rule on the rows
held, and the MASE of what was chosen on the scale of the site's training split."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from edge_agent.choice import choose_at
from edge_agent.data import DataError, SeriesTable, prepare_client
from edge_agent.data.arrays import min_training_rows
from edge_agent.newcomer import Newcomer, own_scale, received_model, window_errors, window_mase
from edge_agent.selection import window_scores


def days_held(table: SeriesTable, client, recipe, days: int) -> int:
    """How many of ``days`` after joining (at the end of ``client``'s training split) the site's
    table holds with each day's forecasts' outcomes: fewer where the dataset ends sooner."""
    after = table.n_rows - len(client.history) - recipe.horizon
    return max(0, min(days, after // client.period - 1))


class Timeline:
    """A site that joins at the first row after its training split (``client``'s), with
    ``days`` days to serve: origins at every row of days 1..days after joining."""

    def __init__(self, table: SeriesTable, client, recipe, days: int) -> None:
        self.table, self.client, self.recipe, self.days = table, client, recipe, days
        self.name, self.period = client.name, client.period
        self.lookback, self.horizon = recipe.lookback, recipe.horizon
        self.joined = len(client.history)  # the table row of its first own row (no history cut: train starts at 0)
        end = self.joined + (days + 1) * self.period + self.horizon
        if end > table.n_rows:
            raise DataError(f"{table.name}: {table.n_rows} rows; {days} days after joining at row {self.joined} "
                            f"need {end}")
        rows = np.asarray(table.values[self.joined:end], dtype=np.float64)
        self.site = Newcomer(rows, table.index[self.joined], table.index[1] - table.index[0], self.period,
                             self.lookback, self.horizon)
        self.origins = np.arange(self.period, (days + 1) * self.period)
        self.day = self.origins // self.period

    @property
    def rows(self) -> np.ndarray:
        return self.site.values

    def per_day(self, forecast_day, days: range | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """(N, H, F) of ``forecast_day(day)`` over ``days`` (all by default), NaN where it gives None."""
        out = np.full((len(self.origins), self.horizon, self.rows.shape[1]), np.nan) if out is None else out
        for day in days or range(1, self.days + 1):
            values = forecast_day(day)
            if values is not None:
                out[self.day == day] = values
        return out

    def anchor_forecasts(self, name: str) -> np.ndarray:
        return self.per_day(lambda day: self.site.anchor_forecasts(name, day))

    def fleet_model(self, state: dict, seed: int):
        """The fleet's model as the site receives it: the global state in a model of its features."""
        return received_model(self.recipe, self.client.n_features, {k: torch.as_tensor(v) for k, v in state.items()},
                              seed)

    def model_forecasts(self, model) -> np.ndarray:
        return self.per_day(lambda day: self.site.model_forecasts(model, day))

    def local_forecasts(self, seed: int, fed, every: int, fleet_state: dict | None = None) -> np.ndarray:
        """The site's local-only model (bench/value.py's Local-only), trained on the rows held once
        they are enough for local training and again every ``every`` days; NaN before. From a
        random start alone; joined, from the fleet's state ``fleet_state``, as the product's companion
        of a gateway that joins a trained fleet starts (``LocalCompanion.start_from``). Where the
        rows held have too many gaps for a window of each split (the agent would wait too), the
        last model trained serves on."""
        from coordinator.simulation.baselines import TrainingBudget, run_local_only

        out = self.per_day(lambda day: None)
        shared = None if fleet_state is None else {k: torch.as_tensor(v) for k, v in fleet_state.items()}
        first = math.ceil(min_training_rows(self.lookback, self.horizon) / self.period)
        trained = None
        for start in range(first, self.days + 1, every):
            try:
                data = prepare_client(self.own_table(start * self.period), self.lookback, self.horizon)
            except DataError:
                data = None
            if data is not None:
                trained = (run_local_only([data], self.recipe, TrainingBudget.matching(fed), shared).models[0].eval(),
                           data.scaler)
            if trained is not None:
                model, scaler = trained
                days = range(start, min(start + every, self.days + 1))
                self.per_day(lambda day: self.site.model_forecasts(model, day, scaler), days, out)
        return out

    def own_table(self, held: int) -> SeriesTable:
        """The site's own table: its first ``held`` rows after joining."""
        rows = slice(self.joined, self.joined + held)
        return dataclasses.replace(self.table, index=self.table.index[rows], values=self.table.values[rows],
                                   observed=self.table.observed[rows], gaps=None)

    def scores(self, candidates: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Each candidate's MASE per origin on the site's training-split scale, like every score of
        bench/value.py (NaN where it has no forecast or the outcome misses a value)."""
        targets = np.stack([self.rows[o:o + self.horizon] for o in self.origins])
        scaler, scale = self.client.scaler, self.client.test.scale
        y = torch.as_tensor(scaler.transform(targets), dtype=torch.float32)
        missing = np.isnan(targets).any(axis=(1, 2))
        return {name: np.where(missing, np.nan, window_scores(
                    [(torch.as_tensor(scaler.transform(values), dtype=torch.float32), y)], None, scale))
                for name, values in candidates.items()}

    def served(self, candidates: dict[str, np.ndarray], selection_days: int, combine: int = 1) -> list[dict]:
        """For days 1..D in order: the candidates the product's rule picks at the day's start (of
        those with forecasts that day; MASE on the rows held then; the ``combine`` best) and the
        mean score of the mean of their forecasts that day (``scores``)."""
        names = list(candidates)
        errors = {name: window_errors(candidates[name], self.rows, self.origins, self.horizon) for name in names}
        served, picks = np.full_like(candidates[names[0]], np.nan), []
        for day in range(1, self.days + 1):
            at, today = day * self.period, self.day == day
            eligible = [n for n in names if np.isfinite(candidates[n][today]).all()] or names
            scale = own_scale(self.rows[:at], self.period)
            picks.append(choose_at(window_mase({n: errors[n] for n in eligible}, scale), self.origins, self.horizon, at,
                                   selection_days * self.period or None, combine))
            served[today] = np.mean([candidates[name][today] for name in picks[-1]], axis=0)
        reported = self.scores({"served": served})["served"]
        out = []
        for day, pick in zip(range(1, self.days + 1), picks):
            chosen = reported[self.day == day]
            out.append({"mase": float(chosen[np.isfinite(chosen)].mean()), "pick": " + ".join(pick)})
        return out
