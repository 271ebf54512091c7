"""``export lava --verify-in-lava``: Lava's own netx loader and fixed-point simulator run our file
(in the venv ``make lava-venv`` builds) and every layer's spikes equal ``simulate_cuba``'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.data import load_site, prepare_client
from export.lava import export_lava
from export.lava_check import LavaUnavailableError
from tests.conftest import calibrated

VENV = Path(__file__).resolve().parents[1] / ".lava-venv"


@pytest.fixture(scope="module")
def site():
    return prepare_client(load_site("amsterdam"), 24, 12, stride=24)


def test_a_missing_lava_venv_says_how_to_build_it(site, tmp_path) -> None:
    with pytest.raises(LavaUnavailableError, match="make lava-venv"):
        export_lava(calibrated("spikernn", site), tmp_path / "m.net", site.test, 8, lava_venv=tmp_path / "none")
    assert not (tmp_path / "m.net").exists()  # refused before writing


@pytest.mark.skipif(not (VENV / ".built").is_file(), reason="no .lava-venv: `make lava-venv` builds it (minutes, PyPI)")
def test_lava_spikes_equal_ours_in_every_layer(site, tmp_path) -> None:
    report = export_lava(calibrated("spikernn", site), tmp_path / "m.net", site.test, 16, lava_venv=VENV, lava_windows=4)
    assert report.details["lava_agreement"] == [1.0, 1.0, 1.0]
    assert report.details["lava_positions"] == 4 * 24 and min(report.details["lava_spikes"]) > 0
