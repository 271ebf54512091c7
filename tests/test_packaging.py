"""The installed package, not the checkout: a wheel carries the hardware profiles and the
dashboard's page it needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from export.profiles import list_profiles

REPO = Path(__file__).resolve().parent.parent


def test_a_wheel_install_finds_the_shipped_hardware_profiles_and_dashboard_page(tmp_path: Path) -> None:
    source, wheels, site = tmp_path / "source", tmp_path / "wheels", tmp_path / "site"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "build", "runs", "*.egg-info", "__pycache__"))
    pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source)],
                   check=True, cwd=tmp_path, timeout=300)
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), *map(str, wheels.glob("*.whl"))],
                   check=True, timeout=300)
    probe = ("import export.profiles as p; print(p.__file__); print(','.join(p.list_profiles())); p.load_profile('loihi');"
             "from importlib.resources import files; page = files('coordinator.observe') / 'static';"
             "print(all((page / f).is_file() for f in ('index.html', 'dashboard.js', 'dashboard.css')))")
    result = subprocess.run([sys.executable, "-c", probe], env={"PYTHONPATH": str(site)}, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    where, names, dashboard = result.stdout.split()
    assert Path(where).is_relative_to(site)
    assert names.split(",") == list_profiles() and len(list_profiles()) >= 4
    assert dashboard == "True"
