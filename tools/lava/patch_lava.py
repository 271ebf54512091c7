"""Two local fixes that let lava-nc 0.10.0 / lava-dl 0.6.0 import on Python 3.11 (run inside the
Lava venv by build_venv.sh; idempotent). 1: ``var_model.py`` gives dataclass fields mutable
defaults (``x: ByteEncoder = ByteEncoder()``), which Python 3.11 rejects: they become
``field(default_factory=ByteEncoder)``. 2: ``slayer.object_detection`` needs torchvision and
OpenCV, which netx never uses: its package is replaced by a stub that fails only when used."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

MUTABLE_DEFAULT = re.compile(r"^(\s+\w+: ByteEncoder) = ByteEncoder\(\)$", re.MULTILINE)
STUB = '''"""Stub written by edgefl tools/lava/patch_lava.py: object detection needs torchvision and
OpenCV, which netx does not use."""


def __getattr__(name):
    raise ImportError(f"lava.lib.dl.slayer.object_detection.{name}: stubbed out in this venv")
'''


def lava_dir() -> Path:
    """The ``lava`` namespace package's folder (lava-nc and lava-dl install into the same one)."""
    spec = importlib.util.find_spec("lava")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"lava is not installed in {sys.prefix}")
    return Path(spec.submodule_search_locations[0])


def fix_var_model(path: Path) -> int:
    text = path.read_text()
    fixed, count = MUTABLE_DEFAULT.subn(r"\1 = field(default_factory=ByteEncoder)", text)
    if count:
        fixed, imports = re.subn(r"^from dataclasses import dataclass, InitVar$",
                                 "from dataclasses import dataclass, field, InitVar", fixed, flags=re.MULTILINE)
        if imports != 1:
            sys.exit(f"{path}: the dataclasses import line is not where expected; fix it by hand")
        path.write_text(fixed)
    elif "field(default_factory=ByteEncoder)" not in text:
        sys.exit(f"{path}: no ByteEncoder default found (a different lava-nc version?)")
    return count


def stub_object_detection(folder: Path) -> None:
    for child in sorted(folder.rglob("*"), reverse=True):  # the real package imports torchvision/cv2
        child.unlink() if child.is_file() else child.rmdir()
    (folder / "__init__.py").write_text(STUB)


def main() -> None:
    var_model = lava_dir() / "magma/compiler/var_model.py"
    print(f"{var_model}: {fix_var_model(var_model)} mutable dataclass defaults fixed")
    slayer = lava_dir() / "lib/dl/slayer"
    stub_object_detection(slayer / "object_detection")
    print(f"{slayer / 'object_detection'}: stubbed")


if __name__ == "__main__":
    main()
