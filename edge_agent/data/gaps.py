"""Missing steps in a regular series: the fill policy, the fill itself and the report of what was
done. Independent of where readings come from (a CSV file, live sensor readings); numpy only, so
the serving-only process fills its window without pandas."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_agent.times import duration_text

if TYPE_CHECKING:
    import pandas as pd

_MAX_LISTED = 3


class GapPolicy(BaseModel):
    """What to do with missing steps. ``refuse``: the data is an error. ``skip``: missing steps stay
    missing and no window may cross them. ``ffill`` / ``interpolate``: a gap of at most
    ``max_fill_steps`` steps is filled with the last value before it / a straight line between the
    values around it; longer gaps are kept as with ``skip``."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    fill: Literal["refuse", "skip", "ffill", "interpolate"] = Field(
        "refuse", description="missing steps: an error (refuse), kept out of every window (skip) or filled")
    max_fill_steps: int = Field(3, ge=1, description="longest gap, in missing steps, that ffill/interpolate fill")

    @property
    def fills(self) -> bool:
        """True for the policies that invent values."""
        return self.fill in ("ffill", "interpolate")


class Cell(IntEnum):
    """Where a value comes from: a real reading, the fill policy, or nowhere (still missing)."""

    REAL = 0
    FILLED = 1
    MISSING = 2


def fill_gaps(values: np.ndarray, policy: GapPolicy) -> tuple[np.ndarray, np.ndarray]:
    """Fill each column's runs of NaN as ``policy`` allows; rows (axis 0) are consecutive steps of a
    regular series, one column or several.

    Returns float64 values (NaN where still missing) and each cell's ``Cell`` status (uint8), both
    shaped like ``values``.
    """
    values = np.array(values, dtype=np.float64)
    status = np.where(np.isnan(values), Cell.MISSING, Cell.REAL).astype(np.uint8)
    if policy.fills:
        columns, statuses = values.reshape(len(values), -1), status.reshape(len(values), -1)
        for j in range(columns.shape[1]):
            _fill_column(columns[:, j], statuses[:, j], policy)
    return values, status


def _fill_column(column: np.ndarray, status: np.ndarray, policy: GapPolicy) -> None:
    """Fill, in place, the runs of NaN of one column that are short enough and have the values the method needs."""
    real = np.flatnonzero(~np.isnan(column))
    missing = np.flatnonzero(np.isnan(column))
    if not real.size or not missing.size:
        return
    after = np.searchsorted(real, missing)
    has_before, has_after = after > 0, after < real.size
    before = np.where(has_before, real[np.maximum(after - 1, 0)], -1)
    behind = np.where(has_after, real[np.minimum(after, real.size - 1)], column.size)
    fillable = has_before & (behind - before - 1 <= policy.max_fill_steps)
    new = column[np.maximum(before, 0)]
    if policy.fill == "interpolate":
        fillable &= has_after
        slope = (column[np.minimum(behind, column.size - 1)] - new) / (behind - before)
        new = new + slope * (missing - before)
    column[missing[fillable]] = new[fillable]
    status[missing[fillable]] = Cell.FILLED


def runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of every run of True in a 1-D boolean mask."""
    edges = np.diff(np.concatenate([[0], np.asarray(mask, dtype=np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), (ends - starts).tolist()))


@dataclass(frozen=True)
class Gap:
    """Consecutive steps missing at least one value: the first one, how many, and how many the fill left missing."""

    start: pd.Timestamp
    steps: int
    kept: int


@dataclass(frozen=True)
class GapReport:
    """What a loader found and did: the sampling step, the policy, and every gap in steps of the series."""

    step: pd.Timedelta
    policy: GapPolicy
    gaps: tuple[Gap, ...] = ()

    @classmethod
    def of(cls, index: pd.DatetimeIndex, status: np.ndarray, step: pd.Timedelta, policy: GapPolicy) -> GapReport:
        """Report the gaps of a filled series from its cell statuses (as ``fill_gaps`` returns them)."""
        missing = (status == Cell.MISSING).any(axis=1)
        gaps = runs((status != Cell.REAL).any(axis=1))
        return cls(step, policy, tuple(Gap(index[s], n, int(missing[s : s + n].sum())) for s, n in gaps))

    @property
    def kept(self) -> tuple[Gap, ...]:
        """The gaps with steps still missing: no window crosses them."""
        return tuple(g for g in self.gaps if g.kept)

    def summary(self) -> str:
        """One line for people: the step, the gaps found, what the policy filled and what it kept."""
        if not self.gaps:
            return f"one row every {duration(self.step)}, no gaps"
        steps = sum(g.steps for g in self.gaps)
        kept = sum(g.kept for g in self.kept)
        parts = [f"one row every {duration(self.step)}; {len(self.gaps)} gaps ({steps} missing steps)"]
        if self.policy.fills:
            filled = len(self.gaps) - len(self.kept)
            parts.append(
                f"filled {filled} ({steps - kept} steps) by {self.policy.fill}, up to {self.policy.max_fill_steps} "
                "steps per gap"
            )
        if self.kept:
            listed = ", ".join(self._where(g) for g in self.kept[:_MAX_LISTED])
            more = ", ..." if len(self.kept) > _MAX_LISTED else ""
            parts.append(f"kept {len(self.kept)} ({kept} steps), windows across them are dropped: {listed}{more}")
        return "; ".join(parts)

    def _where(self, gap: Gap) -> str:
        """A gap for people: how many steps, how long, from when (and how many the fill left, if not all)."""
        left = f", {gap.kept} still missing" if gap.kept < gap.steps else ""
        return f"{gap.steps} steps ({duration(gap.steps * self.step)}) from {gap.start}{left}"


def duration(delta: timedelta | np.timedelta64) -> str:
    """A duration as Python prints it: '1:00:00', '0:30:00', '31 days, 0:00:00' (pandas' Timedelta
    is a timedelta; numpy's is read in nanoseconds)."""
    if isinstance(delta, timedelta):
        return duration_text(delta // timedelta(microseconds=1) * 1_000 + getattr(delta, "nanoseconds", 0))
    return duration_text(int(np.timedelta64(delta, "ns").astype(np.int64)))
