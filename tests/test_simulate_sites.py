"""``edgefl simulate`` with one gateway per site: a folder of CSVs, or one CSV with a site column,
cut from the bundled real weather."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from edge_agent.data import DataError, load_gateways, load_site

SITES = ("greensboro", "miami", "amsterdam")
COLUMNS = ["temp_air", "relative_humidity", "wind_speed"]
DAYS = 30


def edgefl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgefl.cli", *args], capture_output=True, text=True, timeout=300)


def site_frame(site: str, every: int = 1) -> pd.DataFrame:
    """The first ``DAYS`` days of a bundled site's weather, one row every ``every`` hours."""
    table = load_site(site)
    frame = pd.DataFrame(table.values[: DAYS * 24 : every], columns=list(table.columns))[COLUMNS]
    frame.insert(0, "date", table.index[: DAYS * 24 : every].strftime("%Y-%m-%d %H:%M:%S"))
    return frame


def write_sites(folder: Path) -> Path:
    """One CSV per site in ``folder``."""
    folder.mkdir()
    for site in SITES:
        site_frame(site).to_csv(folder / f"{site}.csv", index=False, float_format="%.6g")
    return folder


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused run prints (rc 2)."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_a_folder_of_csvs_makes_one_client_per_file_with_its_federated_scores(tmp_path: Path) -> None:
    folder, out = write_sites(tmp_path / "sites"), tmp_path / "out.json"
    proc = edgefl("simulate", "--data", str(folder), "--rounds", "1", "--lookback", "24", "--horizon", "12",
                  "--d-qap", "16", "--batch-size", "64", "--stride", "4", "--min-steps", "8", "--no-keep-local",
                  "--anchors", "seasonal_naive", "--no-median", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "3 clients, one per site of sites" in " ".join(proc.stdout.split())
    summary = json.loads(out.read_text())
    assert sorted(summary["clients"]) == sorted(SITES)
    assert summary["config"]["clients"] == 3 and summary["config"]["f_max"] is None
    for client in summary["clients"].values():
        assert client["federated"]["mase"] > 0 and client["federated"]["mse"] > 0
    assert summary["federated"]["mase"] > 0


def test_per_site_data_is_refused_in_one_line_naming_the_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "empty: no CSV files" in error_line(edgefl("simulate", "--data", str(empty)))
    folder = write_sites(tmp_path / "sites")
    line = error_line(edgefl("simulate", "--data", str(folder), "--clients", "3"))
    assert "--clients" in line and "one client per site" in line
    site_frame("miami", every=2).to_csv(folder / "miami.csv", index=False)
    line = error_line(edgefl("simulate", "--data", str(folder)))
    assert "miami.csv: sampling interval 2:00:00 differs from amsterdam.csv's 1:00:00" in line


def test_a_site_column_splits_one_csv_and_names_file_site_and_line_of_a_bad_row(tmp_path: Path) -> None:
    long = pd.concat([site_frame(site).assign(site=site) for site in SITES])
    path = tmp_path / "long.csv"
    long.to_csv(path, index=False)
    tables = load_gateways(path, site_column="site")
    assert [t.name for t in tables] == list(SITES) and all(t.columns == tuple(COLUMNS) for t in tables)
    assert all(t.n_rows == DAYS * 24 for t in tables)
    lines = path.read_text().splitlines()
    bad = DAYS * 24 + 6  # miami's fifth row: the header, greensboro's rows, then miami's
    date, _, rest = lines[bad - 1].split(",", 2)
    lines[bad - 1] = ",".join([date, "warm", rest])
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"long.csv \(site 'miami'\): column 'temp_air' has 1 non-numeric values: "
                                        rf"line {bad} \('warm'\)"):
        load_gateways(path, site_column="site")
    with pytest.raises(DataError, match="long.csv: site column 'station' not found"):
        load_gateways(path, site_column="station")
