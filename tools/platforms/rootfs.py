"""Debian 13 (trixie) root filesystems for the Pythons and CPUs a gateway runs: made once with
mmdebstrap (arm64: maintainer scripts under Debian's qemu-user-static) and kept in a cache folder
outside git, so `make arm-check` and `make python-versions` reuse them on a later run.
mmdebstrap, not debootstrap: debootstrap's second stage runs its package scans in emulated
shell and perl, which took over an hour here where mmdebstrap (apt on the host) took minutes."""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CACHE = Path(os.environ.get("EDGEFL_ROOTFS_CACHE", "/var/cache/edgefl-rootfs"))
SUITE = "trixie"
BASE_PACKAGES = "python3,python3-venv,ca-certificates"
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "qemu-aarch64-static": "qemu-user-static",
              "update-binfmts": "binfmt-support"}
BINFMT = Path("/proc/sys/fs/binfmt_misc")
HOST_CA = "etc/ssl/certs/host-ca-certificates.crt"  # the host's trust (a TLS-inspecting proxy's CA included)
# The core qemu-user emulates for arm64 programs: a Raspberry Pi 4's (qemu's default is "max").
EMULATED_CPU = os.environ.get("EDGEFL_QEMU_CPU", "cortex-a72")
CLEAN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8",
             "PIP_CERT": f"/{HOST_CA}", "PIP_DEFAULT_TIMEOUT": "180", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
             "QEMU_CPU": EMULATED_CPU}


def say(message: str) -> None:
    print(f"[platforms] {message}", flush=True)


def host_arch() -> str:
    """The host's Debian architecture name."""
    return {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]


def ensure_host_tools() -> None:
    """mmdebstrap, qemu-user-static and binfmt-support from Debian's packages, when missing."""
    missing = [package for tool, package in HOST_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        say(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def enable_emulation(arch: str) -> None:
    """Let the kernel run ``arch`` binaries through qemu-user (binfmt_misc, 'F' flag: the
    interpreter is opened now, so the root filesystem needs no copy of it)."""
    if arch == host_arch():
        return
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=True)
    subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=False, capture_output=True)
    if "enabled" not in (BINFMT / "qemu-aarch64").read_text():
        raise RuntimeError("binfmt_misc has no enabled qemu-aarch64 entry (update-binfmts --enable qemu-aarch64)")


def ensure_rootfs(arch: str) -> Path:
    """The cached ``trixie`` root filesystem of ``arch`` (amd64 or arm64), built when absent
    (into a temporary folder, renamed when complete, so a broken build is never reused)."""
    ensure_host_tools()
    enable_emulation(arch)
    root = CACHE / f"{SUITE}-{arch}"
    if (root / "usr/bin/python3").exists():
        return root
    building = root.with_name(root.name + ".tmp")
    shutil.rmtree(building, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(f"mmdebstrap {SUITE} {arch} into {building} (minutes; once)")
    subprocess.run(["mmdebstrap", f"--arch={arch}", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE,
                    str(building)], check=True)
    building.rename(root)
    say(f"{root} built in {time.monotonic() - started:.0f} s")
    return root


@contextmanager
def session(root: Path, *shared: Path) -> Iterator[None]:
    """``root`` with /proc and /dev of the host and each ``shared`` folder bind-mounted at its own
    path (so a config file names the same paths inside and out); one session at a time. The host's
    /sys only for a root of the host's CPU: under qemu-user, ONNX Runtime's cpuinfo reads the x86
    topology there and dies of SIGSEGV on import; without it, it warns and uses its defaults."""
    with open(root.with_name(root.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.copyfile("/etc/resolv.conf", root / "etc/resolv.conf")
        shutil.copyfile("/etc/ssl/certs/ca-certificates.crt", root / HOST_CA)
        mounts = [(["-t", "proc", "proc"], root / "proc"), (["--rbind", "/dev"], root / "dev")]
        if root.name.endswith(host_arch()):
            mounts.append((["--rbind", "/sys"], root / "sys"))
        mounts += [(["--bind", str(folder)], root / str(folder).lstrip("/")) for folder in shared]
        done: list[Path] = []
        try:
            for options, target in mounts:
                target.mkdir(parents=True, exist_ok=True)
                subprocess.run(["mount", *options, str(target)], check=True)
                done.append(target)
            yield
        finally:
            for target in reversed(done):
                subprocess.run(["umount", "--recursive", "--lazy", str(target)], check=False)


def chroot_argv(root: Path, argv: list[str]) -> list[str]:
    """``argv`` run in ``root`` with a clean environment (the host's pip settings stay outside)."""
    return ["chroot", str(root), "/usr/bin/env", "-i", *(f"{k}={v}" for k, v in CLEAN_ENV.items()), *argv]


def inside(root: Path, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``root`` and wait for it (an error unless it exits 0)."""
    return subprocess.run(chroot_argv(root, argv), **{"check": True, "text": True, **kwargs})


def ensure_venv(root: Path, name: str, requirements: list[str]) -> str:
    """A venv at /opt/``name`` in ``root`` with exactly ``requirements`` installed from wheels
    (made again when the list changes); returns its path inside ``root``."""
    venv = f"/opt/{name}"
    digest = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()
    marker = root / venv.lstrip("/") / ".requirements-sha256"
    if marker.exists() and marker.read_text() == digest:
        return venv
    shutil.rmtree(root / venv.lstrip("/"), ignore_errors=True)
    started = time.monotonic()
    say(f"venv {venv} in {root.name}: pip install --only-binary=:all: {' '.join(requirements)}")
    inside(root, ["python3", "-m", "venv", venv])
    inside(root, [f"{venv}/bin/pip", "install", "--quiet", "--only-binary=:all:",
                  *requirements])
    marker.write_text(digest)
    say(f"venv {venv} ready in {time.monotonic() - started:.0f} s")
    return venv
