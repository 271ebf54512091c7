"""Scripts no test runs in full must not rot silently: every bench/ script imports and answers
``--help`` and refuses an unknown flag (rc 2), every tools/ module imports (those run inside the
Lava venv are compiled only: Lava is not installed here)."""

from __future__ import annotations

import contextlib
import importlib
import io
import py_compile
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
SCRIPTS = sorted(path.stem for path in (ROOT / "bench").glob("*.py") if '__name__ == "__main__"' in path.read_text())
TOOLS = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tools").rglob("*.py") if path.name != "__init__.py")
LAVA_VENV_ONLY = {"tools/lava/run_netx.py"}  # imports lava at the top: runs in `make lava-venv`'s Python


def main_with(module: str, *args: str) -> tuple[int, str]:
    """Run ``module.main()`` with ``args`` as its command line: its exit status and what it printed."""
    main, out = importlib.import_module(module).main, io.StringIO()
    saved = sys.argv
    sys.argv = [f"{module}.py", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), pytest.raises(SystemExit) as ended:
            main()
    finally:
        sys.argv = saved
    return ended.value.code or 0, out.getvalue()


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_bench_script_answers_help_and_refuses_an_unknown_flag(script: str) -> None:
    code, text = main_with(script, "--help")
    assert code == 0 and "usage:" in text, text
    code, text = main_with(script, "--no-such-flag")
    assert code == 2 and "usage:" in text, text


@pytest.mark.parametrize("script", TOOLS)
def test_every_tools_module_imports(script: str, monkeypatch) -> None:
    """As its Make target runs it: a script beside the modules it imports (``python tools/x/y.py``)."""
    path = ROOT / script
    if script in LAVA_VENV_ONLY:
        py_compile.compile(str(path), doraise=True)
        return
    monkeypatch.syspath_prepend(str(path.parent))
    importlib.import_module(path.stem)


def test_the_lists_are_not_empty() -> None:
    assert len(SCRIPTS) >= 20 and "tools/platforms/arm_check.py" in TOOLS
