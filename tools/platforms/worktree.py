"""The worktree as the platform checks see it: a copy of its files for another root filesystem,
and the commit a result was made at."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from requirements import REPO


def stage_source(target: Path) -> None:
    """The worktree's files (tracked, and new ones git does not ignore) copied to ``target``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout
    target.mkdir(parents=True)
    subprocess.run(f"tar --null -T - -c | tar -x -C {shlex.quote(str(target))}", shell=True, cwd=REPO, input=files, check=True)


def commit() -> str:
    """HEAD's hash, marked when tracked files differ from it (the result is then of no commit)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+uncommitted" if dirty else "")
