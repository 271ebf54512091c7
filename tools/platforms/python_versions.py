"""`make python-versions`: the serve-path and gateway-path tests on Python 3.11 (the project's venv),
3.12 (a venv of the machine's python3.12) and 3.13 (Debian 13's own, in a cached trixie root
filesystem). Writes bench/results/python_versions.json: the interpreters and the tests that
passed on each (for bench/results/gateway.json's python_versions)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from requirements import BUILD, REPO, extra, gateway, pins
from rootfs import CACHE, ensure_rootfs, ensure_venv, inside, say, session
from worktree import commit, stage_source

RESULT = REPO / "bench/results/python_versions.json"
SERVE_TESTS = ["tests/test_serving.py", "tests/test_replay.py",
               "tests/test_live_gateway.py::test_the_serving_only_process_publishes_forecasts_of_each_new_bundle_without_torch"]
GATEWAY_TESTS = ["tests/test_live_gateway.py::test_a_live_gateway_stores_replayed_readings_keeps_them_across_a_restart_and_trains_on_them",
                 "tests/test_packaging.py"]
PYTEST = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *SERVE_TESTS, *GATEWAY_TESTS]
# the live gateway test also runs a coordinator and replays a site
TEST_ENV = list(dict.fromkeys(gateway() + extra("coordinator") + extra("sites") + pins(("pytest",)) + list(BUILD)))


def outcomes(junit: Path) -> dict:
    """Passed, failed and skipped test ids from pytest's JUnit XML."""
    found: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    for case in ElementTree.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        kind = ("failed" if case.find("failure") is not None or case.find("error") is not None
                else "skipped" if case.find("skipped") is not None else "passed")
        found[kind].append(name)
    return found


def find_python(version: str) -> str:
    """An interpreter of ``version`` on the host: on PATH, or one that pyenv installed (whose
    shims answer only for the selected version)."""
    pyenv = subprocess.run(["sh", "-c", "pyenv root"], capture_output=True, text=True).stdout.strip()
    candidates = [shutil.which(f"python{version}"), *sorted(Path(pyenv or "/nonexistent").glob(
        f"versions/{version}.*/bin/python{version}"), reverse=True)]
    for candidate in filter(None, candidates):
        done = subprocess.run([str(candidate), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if done.stdout.strip() == version:
            return str(candidate)
    raise FileNotFoundError(f"no Python {version} on this machine (PATH or pyenv)")


def host_venv(python: str, venv: Path) -> str:
    """A venv of ``python`` at ``venv`` with TEST_ENV installed (made again when TEST_ENV changes);
    its interpreter."""
    marker = venv / ".requirements"
    if not marker.exists() or marker.read_text() != "\n".join(TEST_ENV):
        say(f"venv {venv} of {python}: pip install {' '.join(TEST_ENV)}")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "--quiet", *TEST_ENV], check=True)
        marker.write_text("\n".join(TEST_ENV))
    return str(venv / "bin/python")


def on_host(python: str) -> dict:
    """The tests with ``python`` on the host."""
    with tempfile.TemporaryDirectory(prefix="edgefl-pythons-") as tmp:
        junit = Path(tmp) / "junit.xml"
        version, seconds = run_tests([python], junit, cwd=REPO, env_path=str(REPO))
        return {"python": version, "where": f"{python} on the host", "seconds": seconds, **outcomes(junit)}


def run_tests(prefix: list[str], junit: Path, cwd: Path, env_path: str, root: Path | None = None) -> tuple[str, float]:
    """Run PYTEST with the interpreter ``prefix`` (chrooted when ``root``); its version and seconds."""
    argv = [*prefix, "-c", "import platform; print(platform.python_version())"]
    version = (inside(root, argv, capture_output=True) if root else
               subprocess.run(argv, check=True, capture_output=True, text=True)).stdout.strip()
    say(f"Python {version}: pytest {' '.join(SERVE_TESTS + GATEWAY_TESTS)}")
    started = time.monotonic()
    argv = ["env", f"PYTHONPATH={env_path}", *prefix, *PYTEST, f"--junitxml={junit}"]
    if root:
        inside(root, ["sh", "-c", f'cd "{cwd}" && exec "$@"', "sh", *argv], check=False)
    else:
        subprocess.run(argv, cwd=cwd, check=False)
    return version, round(time.monotonic() - started, 1)


def in_trixie() -> dict:
    """The tests with Debian 13's Python 3.13 in the cached amd64 root filesystem (mosquitto from
    Debian's packages there too), on a copy of the worktree mounted at the same path."""
    root = ensure_rootfs("amd64")
    with tempfile.TemporaryDirectory(prefix="edgefl-pythons-") as tmp:
        work = Path(tmp)
        stage_source(work / "src")
        with session(root, work):
            if not (root / "usr/sbin/mosquitto").exists():
                inside(root, ["sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                                          "apt-get install -y -qq mosquitto"], capture_output=True)
            venv = ensure_venv(root, "edgefl-gateway", TEST_ENV)
            version, seconds = run_tests([f"{venv}/bin/python"], work / "junit.xml", cwd=work / "src",
                                         env_path=str(work / "src"), root=root)
        return {"python": version, "where": f"Debian 13 (trixie) amd64 root filesystem, {venv}", "seconds": seconds,
                **outcomes(work / "junit.xml")}


def main() -> None:
    results = {
        "3.11": on_host(sys.executable),
        "3.12": on_host(host_venv(find_python("3.12"), CACHE / "venv-python3.12")),
        "3.13": in_trixie(),
    }
    RESULT.write_text(json.dumps({"command": "make python-versions", "commit": commit(),
                                  "tests": SERVE_TESTS + GATEWAY_TESTS, "python_versions": results}, indent=2) + "\n")
    for label, found in results.items():
        say(f"{label}: Python {found['python']}: {len(found['passed'])} passed, {len(found['failed'])} failed, "
            f"{len(found['skipped'])} skipped")


if __name__ == "__main__":
    main()
