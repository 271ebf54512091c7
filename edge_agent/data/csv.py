"""Loader for the standard long-horizon CSV layout (ETTh1, Electricity, Traffic): a date then numeric columns.

The sampling step is the most common interval between rows. Missing timestamps and empty cells are
gaps: refused unless a GapPolicy skips or fills them. Row numbers in error messages are file line
numbers, counting the header as line 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from edge_agent.data.gaps import GapPolicy, duration
from edge_agent.data.errors import file_not_found
from edge_agent.data.table import DataError, SeriesTable
from edge_agent.times import interval_text

_MAX_LISTED = 5
_LINES = "(header is line 1)"
_FILL_HINT = "to skip or fill them, pass --fill skip|ffill|interpolate (in agent.toml: data.gaps.fill)"


def load_csv(
    path: str | Path,
    date_column: str | None = None,
    columns: Sequence[str] | None = None,
    gaps: GapPolicy = GapPolicy(),
    table_name: str | None = None,
) -> SeriesTable:
    """Read a date-indexed numeric CSV into a float32 SeriesTable on its regular step, validating every field.

    With `columns=None` all numeric columns are kept and purely textual ones are ignored (listed in
    the table's `ignored`). Gaps are
    handled as `gaps` says; the table's `gaps` attribute reports what was found and filled. The
    table is named `table_name` (default: the file's name); messages always name the file.
    """
    path = Path(path)
    frame, lines = _read_frame(path)
    return _frame_table(path.name, table_name or path.name, frame, lines, date_column, columns, gaps)


def load_csv_sites(
    path: str | Path, site_column: str, date_column: str | None = None, gaps: GapPolicy = GapPolicy()
) -> dict[str, SeriesTable]:
    """One table per site of a long CSV whose `site_column` says which site each row belongs to,
    each named by its site and validated as `load_csv` validates a file (its own dates, step and
    gaps; every numeric column but the site's). Keyed by how messages name the site's rows: the
    file and the site, with file line numbers, so a bad row is found in the file as it is."""
    path = Path(path)
    frame, lines = _read_frame(path)
    if site_column not in frame.columns:
        raise DataError(f"{path.name}: site column '{site_column}' not found; columns: {_short(frame.columns)}")
    sites = _site_names(path.name, frame[site_column], lines)
    rest = frame.drop(columns=site_column)
    tables = {}
    for site in pd.unique(sites):
        rows = (sites == site).to_numpy()
        label = f"{path.name} (site {site!r})"
        tables[label] = _frame_table(label, site, rest.loc[rows].reset_index(drop=True), lines[rows], date_column,
                                     None, gaps)
    return tables


def _site_names(name: str, raw: pd.Series, lines: np.ndarray) -> pd.Series:
    """Each row's site as text, refusing rows without one."""
    sites = raw.astype("string").str.strip()
    bad = np.flatnonzero((sites.isna() | (sites == "")).to_numpy())
    if bad.size:
        shown = ", ".join(str(lines[i]) for i in bad[:_MAX_LISTED])
        raise DataError(f"{name}: site column '{raw.name}' is empty at {bad.size} rows: lines {shown} {_LINES}")
    return sites


def _frame_table(
    name: str,
    table_name: str,
    frame: pd.DataFrame,
    lines: np.ndarray,
    date_column: str | None,
    columns: Sequence[str] | None,
    gaps: GapPolicy,
) -> SeriesTable:
    """`load_csv`'s validation of parsed rows (`lines`: their file lines), messages naming `name`,
    into a table named `table_name`."""
    date_name = _pick_date_column(name, frame, date_column)
    index = _parse_dates(name, frame[date_name], lines)
    wanted = _pick_value_columns(name, frame, date_name, columns)
    values = np.column_stack([_numeric(name, frame[c], lines) for c in wanted])
    _check_finite(name, values, wanted, lines, gaps)
    _check_float32_range(name, values, wanted, lines)
    step = _infer_step(name, index)
    rows = _grid_rows(name, index, step, lines)
    if gaps.fill == "refuse":
        _refuse_missing_steps(name, index, rows, step, lines)
    index, values = _on_grid(index, rows, step, values)
    ignored = [str(c) for c in frame.columns if c != date_name and c not in wanted] if columns is None else []
    return SeriesTable.on_grid(table_name, index, values, wanted, step, gaps, ignored)


def _read_frame(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """Parse the file, drop blank lines, and return the frame plus each row's file line number."""
    if not path.is_file():
        raise file_not_found(path)
    try:
        frame = pd.read_csv(path, skip_blank_lines=False)
    except pd.errors.EmptyDataError as err:
        raise DataError(f"{path.name}: file is empty") from err
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as err:
        raise DataError(f"{path.name}: not a readable CSV file ({err})") from err
    lines = np.arange(len(frame)) + 2
    keep = ~frame.isna().all(axis=1).to_numpy()
    frame, lines = frame.loc[keep].reset_index(drop=True), lines[keep]
    if frame.empty:
        raise DataError(f"{path.name}: no data rows below the header")
    if frame.shape[1] < 2:
        raise DataError(
            f"{path.name}: only one column ({str(frame.columns[0])!r}); expected a date column and numeric "
            "columns separated by commas"
        )
    return frame, lines


def _pick_date_column(name: str, frame: pd.DataFrame, date_column: str | None) -> str:
    """Return the requested date column, else one named 'date' (any case), else the first column."""
    if date_column is not None:
        if date_column not in frame.columns:
            raise DataError(f"{name}: date column '{date_column}' not found; columns: {_short(frame.columns)}")
        return date_column
    named = [c for c in frame.columns if str(c).strip().lower() == "date"]
    return named[0] if named else frame.columns[0]


def _parse_dates(name: str, raw: pd.Series, lines: np.ndarray) -> pd.DatetimeIndex:
    """Parse timestamps and require them to be strictly increasing."""
    if pd.api.types.is_numeric_dtype(raw):
        raise DataError(f"{name}: date column '{raw.name}' holds numbers, not dates")
    try:
        index = pd.DatetimeIndex(pd.to_datetime(raw, errors="coerce"))
    except (ValueError, TypeError) as err:
        raise DataError(f"{name}: date column '{raw.name}' cannot be parsed ({err})") from err
    bad = np.flatnonzero(index.isna())
    if bad.size:
        shown = ", ".join(f"line {lines[i]} ({raw.iloc[i]!r})" for i in bad[:_MAX_LISTED])
        raise DataError(f"{name}: date column '{raw.name}' has {bad.size} unparsable values: {shown} {_LINES}")
    _check_increasing(name, index, lines)
    return index


def _check_increasing(name: str, index: pd.DatetimeIndex, lines: np.ndarray) -> None:
    """Raise naming the first rows whose timestamp does not come after the previous one."""
    bad = np.flatnonzero(np.diff(index.asi8) <= 0) + 1
    if not bad.size:
        return
    kind = "duplicated" if (index[bad] == index[bad - 1]).all() else "not strictly increasing"
    shown = ", ".join(
        f"line {lines[i]} ({index[i]}) after line {lines[i - 1]} ({index[i - 1]})" for i in bad[:_MAX_LISTED]
    )
    raise DataError(f"{name}: dates are {kind} at {bad.size} rows: {shown} {_LINES}")


def _pick_value_columns(
    name: str, frame: pd.DataFrame, date_name: str, columns: Sequence[str] | None
) -> list[str]:
    """Return the requested columns, or every numeric-looking column except the date."""
    if columns is not None:
        missing = [c for c in columns if c not in frame.columns or c == date_name]
        if missing:
            raise DataError(f"{name}: requested columns {missing} not found; available: {_short(frame.columns)}")
        return list(columns)
    numeric = [c for c in frame.columns if c != date_name and _looks_numeric(frame[c])]
    if not numeric:
        raise DataError(f"{name}: no numeric columns besides the date column '{date_name}'")
    return numeric


def _looks_numeric(raw: pd.Series) -> bool:
    """A column counts as numeric when at least one of its cells parses as a number."""
    if pd.api.types.is_bool_dtype(raw):
        return False
    if pd.api.types.is_numeric_dtype(raw):
        return True
    return bool(pd.to_numeric(raw, errors="coerce").notna().any())


def _numeric(name: str, raw: pd.Series, lines: np.ndarray) -> np.ndarray:
    """Convert one column to float64, raising on cells that are present but not numbers."""
    if pd.api.types.is_numeric_dtype(raw) and not pd.api.types.is_bool_dtype(raw):
        return raw.to_numpy(dtype=np.float64, na_value=np.nan)
    parsed = pd.to_numeric(raw.astype("string").str.strip(), errors="coerce")
    bad = np.flatnonzero((parsed.isna() & raw.notna()).to_numpy())
    if bad.size:
        shown = ", ".join(f"line {lines[i]} ({raw.iloc[i]!r})" for i in bad[:_MAX_LISTED])
        raise DataError(f"{name}: column '{raw.name}' has {bad.size} non-numeric values: {shown} {_LINES}")
    return parsed.to_numpy(dtype=np.float64, na_value=np.nan)


def _check_finite(name: str, values: np.ndarray, columns: list[str], lines: np.ndarray, gaps: GapPolicy) -> None:
    """Raise listing, per column, the count and first lines of inf cells, and of NaN (empty) cells
    too when the policy refuses gaps."""
    refused = np.isinf(values) | (np.isnan(values) if gaps.fill == "refuse" else False)
    kind = "NaN/inf" if gaps.fill == "refuse" else "inf"
    problems = []
    for j in np.flatnonzero(refused.any(axis=0)):
        bad = np.flatnonzero(refused[:, j])
        shown = ", ".join(str(lines[i]) for i in bad[:_MAX_LISTED])
        more = ", ..." if bad.size > _MAX_LISTED else ""
        problems.append(f"column '{columns[j]}' has {bad.size} {kind} values at lines {shown}{more}")
    if problems:
        hint = f"; {_FILL_HINT}" if (refused & np.isnan(values)).any() else ""
        raise DataError(f"{name}: " + "; ".join(problems) + f" {_LINES}{hint}")


def _check_float32_range(name: str, values: np.ndarray, columns: list[str], lines: np.ndarray) -> None:
    """Raise on magnitudes that would overflow float32."""
    too_big = np.abs(values) > np.finfo(np.float32).max
    if too_big.any():
        i, j = np.argwhere(too_big)[0]
        raise DataError(
            f"{name}: column '{columns[j]}' has {int(too_big[:, j].sum())} values beyond float32 range, "
            f"first at line {lines[i]} ({values[i, j]:g}) {_LINES}"
        )


def _infer_step(name: str, index: pd.DatetimeIndex) -> pd.Timedelta:
    """The sampling step: the most common interval between consecutive rows, refused unless it is
    at least half of them (otherwise the file has no regular step to fill or window on)."""
    if len(index) < 2:
        raise DataError(f"{name}: only one data row; the sampling step needs at least two")
    intervals, counts = np.unique(np.asarray(index[1:] - index[:-1]), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    if 2 * counts[order[0]] < counts.sum():
        seen = ", ".join(f"{duration(intervals[i])} ({counts[i]} times)" for i in order[:_MAX_LISTED])
        common = interval_text(int(np.timedelta64(intervals[order[0]], "ns").astype(np.int64)))
        raise DataError(
            f"{name}: no regular sampling step: the most common interval between rows covers only "
            f"{counts[order[0]]} of {counts.sum()}; intervals seen: {seen}; put the rows on one interval "
            f"first (e.g. pandas: frame.resample('{common}').mean())"
        )
    return pd.Timedelta(intervals[order[0]])


def _grid_rows(name: str, index: pd.DatetimeIndex, step: pd.Timedelta, lines: np.ndarray) -> np.ndarray:
    """Each row's position on the regular grid from the first timestamp; rows off the grid are refused."""
    offsets = index - index[0]
    bad = np.flatnonzero(np.asarray(offsets % step) != np.timedelta64(0))
    if bad.size:
        shown = ", ".join(f"line {lines[i]} ({index[i]})" for i in bad[:_MAX_LISTED])
        raise DataError(
            f"{name}: {bad.size} timestamps are off the {duration(step)} step (the most common interval) "
            f"from line {lines[0]} ({index[0]}): {shown} {_LINES}"
        )
    return np.asarray(offsets // step)


def _refuse_missing_steps(
    name: str, index: pd.DatetimeIndex, rows: np.ndarray, step: pd.Timedelta, lines: np.ndarray
) -> None:
    """Raise listing where timestamps are missing (the file lines either side) and for how many steps."""
    jumps = np.flatnonzero(np.diff(rows) > 1)
    if not jumps.size:
        return
    missing = np.diff(rows)[jumps] - 1
    shown = ", ".join(
        f"{n} steps ({duration(n * step)}) between line {lines[i]} ({index[i]}) "
        f"and line {lines[i + 1]} ({index[i + 1]})"
        for i, n in zip(jumps[:_MAX_LISTED], missing)
    )
    more = ", ..." if jumps.size > _MAX_LISTED else ""
    raise DataError(
        f"{name}: {jumps.size} gaps in the timestamps ({missing.sum()} missing steps of {duration(step)}): "
        f"{shown}{more} {_LINES}; {_FILL_HINT}"
    )


def _on_grid(
    index: pd.DatetimeIndex, rows: np.ndarray, step: pd.Timedelta, values: np.ndarray
) -> tuple[pd.DatetimeIndex, np.ndarray]:
    """Put the rows on the regular grid from the first to the last timestamp, missing steps as NaN rows.

    A file without missing timestamps keeps its own index and values as they are.
    """
    if rows[-1] + 1 == len(index):
        return index, values
    grid = pd.date_range(index[0], periods=rows[-1] + 1, freq=step, unit=index.unit)
    full = np.full((len(grid), values.shape[1]), np.nan)
    full[rows] = values
    return grid, full


def _short(columns: pd.Index) -> str:
    """List column names for a message, truncated for very wide files."""
    names = [str(c) for c in columns]
    return str(names) if len(names) <= 12 else str(names[:12])[:-1] + f", ... ({len(names)} in all)]"
