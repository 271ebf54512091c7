"""Every input that ever crashed the decoder or the agent (``bench/fuzz.py`` keeps them in
``tests/fuzz_corpus``) is replayed: ``decode`` may raise nothing but ``ProtocolError``, the
agent's round handler nothing at all, and the poison messages in ``reject/`` are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edge_agent.protocol import ProtocolError, decode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from fuzz import CORPUS, MAX_PAYLOAD, agent_crash, decode_crash, make_agent  # noqa: E402


def corpus(*folders: str) -> list:
    """The corpus files of ``folders``, each a test case named ``folder/file``."""
    files = sorted(path for folder in folders for path in (CORPUS / folder).glob("*.bin"))
    return [pytest.param(path, id=f"{path.parent.name}/{path.name[:12]}") for path in files]


def describe(err: BaseException | None) -> str:
    return f"{type(err).__name__}: {str(err)[:300]}"


def test_the_corpus_is_not_empty() -> None:
    assert corpus("decode") and corpus("agent") and corpus("reject")


@pytest.mark.parametrize("path", corpus("decode", "agent", "reject"))
def test_decode_raises_nothing_but_protocol_error(path: Path) -> None:
    err = decode_crash(path.read_bytes())
    assert err is None, describe(err)


@pytest.mark.parametrize("path", corpus("reject"))
def test_poison_headers_are_refused(path: Path) -> None:
    with pytest.raises(ProtocolError):
        decode(path.read_bytes(), MAX_PAYLOAD)


@pytest.mark.parametrize("path", corpus("agent"))
def test_the_agent_round_handler_survives(path: Path, tmp_path: Path) -> None:
    err = agent_crash(make_agent(tmp_path), path.read_bytes())
    assert err is None, describe(err)
