"""`make wheels`: does every pinned requirement install from wheels on Python 3.11-3.13, x86_64 and
aarch64 (glibc 2.41, Debian 13)? pip resolves each set for each target without installing (it
reads the wheels' metadata, not the wheels) and bench/results/wheels.json lists the wheel each
package would install, or pip's reason where a set does not resolve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from requirements import REPO, SERVE, gateway, pins, project
from worktree import commit

RESULT = REPO / "bench/results/wheels.json"
PYTHONS = ("3.11", "3.12", "3.13")
MACHINES = ("x86_64", "aarch64")
GLIBC_MINOR = 41  # Debian 13; a wheel built for any older glibc also runs there
GPU_PREFIXES = ("nvidia-", "cuda-", "triton")


def platform_tags(machine: str) -> list[str]:
    """pip's --platform values for a glibc-2.41 Linux on ``machine`` (pip does not expand them)."""
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(17, GLIBC_MINOR + 1)]
    return tags + [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]


def sets() -> dict[str, list[str]]:
    """The requirement sets: what the serve path imports, the whole package, and each extra."""
    extras = {f"extra:{name}": [r for r in reqs if not r.startswith("edgefl")]
              for name, reqs in project()["optional-dependencies"].items()}
    return {"serve": pins(SERVE), "gateway": gateway(), **{k: v for k, v in extras.items() if v}}


def resolve(requirements: list[str], python: str, machine: str) -> dict:
    """The wheels pip would install for ``requirements`` on that target (PyPI alone: the local
    wheel folders and caps of this machine's pip configuration left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    env["PIP_CONFIG_FILE"] = os.devnull
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                               "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
                               *(f"--platform={tag}" for tag in platform_tags(machine)),
                               "--target", str(Path(tmp) / "target"), "--report", str(report), *requirements],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            reason = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
            return {"resolves": False, "error": " / ".join(reason) or done.stderr[-500:]}
        installs = json.loads(report.read_text())["install"]
    wheels = {i["metadata"]["name"].lower(): i["download_info"]["url"].rsplit("/", 1)[-1] for i in installs}
    return {"resolves": True, "wheels": len(wheels),
            "gpu_packages": sorted(name for name in wheels if name.startswith(GPU_PREFIXES)),
            "wheel_of": {name: wheels[name] for name in sorted(wheels)}}


def main() -> None:
    results: dict[str, dict] = {}
    for name, requirements in sets().items():
        for python in PYTHONS:
            for machine in MACHINES:
                found = resolve(requirements, python, machine)
                print(f"{name:>14} cp{python.replace('.', '')} {machine:>7}: "
                      + (f"{found['wheels']} wheels, {len(found['gpu_packages'])} GPU packages" if found["resolves"]
                         else f"does not resolve: {found['error']}"), flush=True)
                results.setdefault(name, {})[f"{python}/{machine}"] = found
    RESULT.write_text(json.dumps({"command": "make wheels", "commit": commit(), "sets": sets(), "glibc": f"2.{GLIBC_MINOR}",
                                  "results": results}, indent=2) + "\n")
    print(f"wrote {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
