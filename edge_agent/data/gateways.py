"""One gateway per site: a folder of CSVs (one per gateway, named by the file's stem) or one long
CSV with a site column (one gateway per site), each read and validated as ``load_csv`` reads a
file, and all on one sampling interval."""

from __future__ import annotations

from pathlib import Path

from edge_agent.data.csv import load_csv, load_csv_sites
from edge_agent.data.gaps import GapPolicy, duration
from edge_agent.data.table import DataError, SeriesTable, sampling_step


def load_gateways(
    path: str | Path, date_column: str | None = None, site_column: str | None = None, gaps: GapPolicy = GapPolicy()
) -> list[SeriesTable]:
    """Every gateway's table, named as its client will be: from the CSVs of the folder ``path``,
    or, with ``site_column``, from the rows of each site of the CSV ``path``. Refuses sites whose
    sampling intervals differ, naming both, since the fleet's models and seasons share one step."""
    path = Path(path)
    if site_column is not None and path.is_dir():
        raise DataError(f"{path.name}: a site column splits one CSV into sites; a folder holds one CSV per site")
    if site_column is not None:
        tables = load_csv_sites(path, site_column, date_column, gaps)
    else:
        tables = {file.name: load_csv(file, date_column, gaps=gaps, table_name=file.stem) for file in csv_files(path)}
    check_one_interval(tables)
    return list(tables.values())


def csv_files(folder: Path) -> list[Path]:
    """The folder's CSV files in name order, refusing a folder without any and two files that
    would name the same gateway (``a.csv`` and ``a.CSV``)."""
    if not folder.is_dir():
        raise DataError(f"{folder.name}: not a folder ({folder}); give a folder of CSVs, one per gateway")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() == ".csv")
    if not files:
        raise DataError(f"{folder.name}: no CSV files (*.csv) in the folder ({folder}); put one CSV per gateway there")
    stems = [p.stem for p in files]
    twins = [p.name for p in files if stems.count(p.stem) > 1]
    if twins:
        raise DataError(f"{folder.name}: {', '.join(twins)} would name the same gateway; rename one")
    return files


def check_one_interval(tables: dict[str, SeriesTable]) -> None:
    """Raise naming the first table (by its key: file, or file and site) whose sampling interval
    differs from the first one's, with both intervals."""
    (first, reference), *rest = tables.items()
    step = sampling_step(reference)
    for label, table in rest:
        if sampling_step(table) != step:
            raise DataError(f"{label}: sampling interval {duration(sampling_step(table))} differs from {first}'s "
                            f"{duration(step)}; every gateway must share one interval (resample first)")
