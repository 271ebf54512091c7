"""Real multi-site data for the benchmarks beyond the bundled weather stations.

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
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from common import ROOT
from edge_agent.data import SeriesTable

WHEEL = "CityLearn-2.1.2-py3-none-any.whl"
SHA256 = "95730b1deed73b1f5a4d17eb8334be3c99efa4aef8677822378d62d8359511dd"
FOLDER = "citylearn/data/citylearn_challenge_2022_phase_all/"
COLUMNS = {"Equipment Electric Power [kWh]": "load", "Solar Generation [W/kW]": "solar"}
START, HOMES, FONTANA = "2016-07-31 23:00", [i for i in range(1, 18) if i != 15], (34.09, -117.43)


def citylearn_wheel(cache: Path = ROOT / "bench" / ".cache") -> Path:
    """The CityLearn 2.1.2 wheel, downloaded once into ``cache`` and checked."""
    path = cache / WHEEL
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "CityLearn==2.1.2", "-d", str(cache)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{path}: SHA-256 {digest[:12]}..., expected {SHA256[:12]}...; delete it and retry")
    return path


def citylearn_homes() -> list[SeriesTable]:
    """The homes (all but 15) as tables home01..home17 with columns load and solar."""
    with zipfile.ZipFile(citylearn_wheel()) as wheel:
        frames = {i: pd.read_csv(wheel.open(f"{FOLDER}Building_{i}.csv")) for i in HOMES}
    index = pd.date_range(START, periods=len(frames[HOMES[0]]), freq="h")
    return [SeriesTable(f"home{i:02d}", index, frame[list(COLUMNS)].to_numpy(np.float32), tuple(COLUMNS.values()),
                        *FONTANA) for i, frame in frames.items()]
