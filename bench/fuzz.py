"""Fuzzing of what a hostile or broken peer can put on the wire (issue 12, item 7).

Two targets, each fed by atheris (coverage-guided libFuzzer for Python):

- ``decode``: ``protocol.decode``. A crash is any exception other than ``ProtocolError``.
- ``agent``: ``Agent._handle`` of a real agent (small dlinear model, a bundled weather site, no
  broker connection) fed round/reply/personal envelopes. A crash is any exception at all.

The fuzzer's bytes are not sent as they are: most inputs steer a structure-aware generator
(``Envelopes``) that builds a well-formed envelope and then breaks one part of it (a header
field of the wrong type, deep nesting, huge integers, long strings, many metric keys, a
corrupted safetensors body, a wrong digest or length), so that inputs get past the magic and
the JSON parser to the code behind them. Each crashing payload (the envelope, not the fuzzer's
bytes) is kept as ``tests/fuzz_corpus/<target>/<sha1>.bin``; per crash site only the smallest
payload is kept (cheap minimization). ``tests/test_fuzz_corpus.py`` replays them.

    python bench/fuzz.py --inputs 100000 --seed 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import ROOT

CORPUS = ROOT / "tests" / "fuzz_corpus"
SHARES = {"decode": 0.75, "agent": 0.25}  # of run_fuzz's inputs; the agent target is slower per input
AGENT_EPOCH = 500  # the fuzzed agent is rebuilt on a fresh state folder after this many inputs
MAX_PAYLOAD = 64 * 1024 * 1024


# --- envelopes from fuzz bytes ----------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """JSON text emitted as it is: what ``json.dumps`` cannot or should not write for us
    (5,000-digit integers, 100,000 levels of nesting, lone surrogate escapes)."""

    text: str


def to_json(value: object) -> str:
    """JSON text of ``value``; ``Raw`` fragments go in verbatim, floats may be NaN/Infinity
    (which Python's parser accepts, so a peer can send them)."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    return json.dumps(value)


def envelope(header: object, body: bytes, magic: bytes = b"EDFL", version: int = 1,
             length: int | None = None) -> bytes:
    """An envelope around any header value (``length`` None: the true header length)."""
    raw = to_json(header).encode("utf-8", "surrogatepass")
    return struct.pack(">4sBI", magic, version, len(raw) if length is None else length) + raw + body


def with_body(header: dict, body: bytes) -> dict:
    """``header`` with the digest and size of ``body`` filled in, as an honest sender would."""
    return {**header, "body_sha256": hashlib.sha256(body).hexdigest() if body else "", "body_bytes": len(body)}


@dataclass(frozen=True)
class Peer:
    """What a plausible message for one receiver holds: its fleet, model signature and a body
    whose tensors have the right names, shapes and dtypes."""

    fleet: str
    signature: str
    tensors: dict


def valid_header(kind: str, peer: Peer, number: int) -> dict:
    """A header of ``kind`` that the current protocol accepts."""
    fields = {
        "round": {"deadline_unix": 2.0e9, "model_signature": peer.signature, "finished": False},
        "reply": {"accepted": True, "about": "update", "code": "", "reason": ""},
        "personal": {},
        "update": {"n_samples": 100, "metrics": {"loss": 0.5}},
        "hello": {"n_features": 3, "n_samples": 100, "latitude": 52.0, "longitude": 4.9,
                  "model_signature": peer.signature},
    }[kind]
    return {"fleet": peer.fleet, "sender": "coordinator", "round": number, "kind": kind, **fields}


class Envelopes:
    """Builds one envelope from a ``FuzzedDataProvider``: mostly valid, with a few parts broken."""

    KINDS = ["round", "reply", "personal", "update", "hello"]
    KEYS = ["kind", "fleet", "sender", "round", "body_sha256", "body_bytes", "encoding", "n_samples", "metrics",
            "n_features", "latitude", "model_signature", "deadline_unix", "finished", "accepted", "about",
            "code", "reason", "campaign", "unexpected"]
    CODES = ["", "duplicate", "unknown_client", "late", "future_round", "internal"]
    DTYPES = ["float64", "float16", "bfloat16", "int64", "int8", "bool"]

    def __init__(self, fdp, peer: Peer):
        self.fdp, self.peer = fdp, peer

    def build(self) -> bytes:
        if self.fdp.ConsumeProbability() > 0.95:
            return self.fdp.ConsumeBytes(self.fdp.remaining_bytes())
        header = valid_header(self.fdp.PickValueInList(self.KINDS), self.peer, self.fdp.ConsumeIntInRange(0, 8))
        if header["kind"] == "reply":
            header.update(code=self.fdp.PickValueInList(self.CODES), accepted=self.fdp.ConsumeBool(),
                          about=self.fdp.PickValueInList(["hello", "update", "other"]))
        if header["kind"] == "round":
            header["finished"] = self.fdp.ConsumeProbability() < 0.1
        body = self.body()
        header = with_body(header, body)
        for _ in range(self.fdp.ConsumeIntInRange(0, 3)):
            self.mutate(header)
        top: object = header if self.fdp.ConsumeProbability() < 0.97 else self.value(0)
        return self.frame(top, body)

    def frame(self, header: object, body: bytes) -> bytes:
        """The prefix, usually right; sometimes a wrong magic, version or header length."""
        odd = self.fdp.ConsumeIntInRange(0, 40)
        if odd == 0:
            return envelope(header, body, magic=self.fdp.ConsumeBytes(4).ljust(4, b"\0"))
        if odd == 1:
            return envelope(header, body, version=self.fdp.ConsumeIntInRange(0, 255))
        if odd == 2:
            return envelope(header, body, length=self.fdp.ConsumeIntInRange(0, 2**32 - 1))
        return envelope(header, body)

    def mutate(self, header: dict) -> None:
        key = self.fdp.PickValueInList(self.KEYS)
        action = self.fdp.ConsumeIntInRange(0, 9)
        if action == 0:
            header.pop(key, None)
        elif action == 1:
            header["metrics"] = self.many_metrics()
        else:
            header[key] = self.value(0)

    def many_metrics(self) -> dict:
        count = 1 << self.fdp.ConsumeIntInRange(0, 12)
        return {f"m{i}": self.fdp.ConsumeFloat() if i == 0 else float(i) for i in range(count)}

    def value(self, depth: int) -> object:
        """One hostile JSON value: wrong types, edge numbers, huge or deep things."""
        fdp = self.fdp
        match fdp.ConsumeIntInRange(0, 13):
            case 0:
                return None
            case 1:
                return fdp.ConsumeBool()
            case 2:
                return fdp.ConsumeIntInRange(-(2**31), 2**31)
            case 3:
                return Raw(fdp.PickValueInList(["", "-"]) + "9" * fdp.ConsumeIntInRange(1, 6000))
            case 4:
                return 2 ** fdp.ConsumeIntInRange(31, 70) + fdp.ConsumeIntInRange(-1, 1)
            case 5:
                return fdp.ConsumeFloat()
            case 6:
                return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 64))
            case 7:
                return "x" * (1 << fdp.ConsumeIntInRange(0, 18))
            case 8:
                return self.deep()
            case 9:
                return [self.value(depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))] if depth < 3 else []
            case 10:
                return {fdp.ConsumeUnicode(8): self.value(depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))} \
                    if depth < 3 else {}
            case 11:
                return fdp.PickValueInList(["3", "2.0", "true", "1e5", "-1", "NaN", "coordinator", "update", ""])
            case 12:
                return Raw(fdp.PickValueInList(['"\\ud800"', '"\\udfff x"', '"\\u0000"']))
            case _:
                return fdp.PickValueInList([2.0, -0.0, 1e308, 2**63, -(2**63), 1.5, math.pi])

    def deep(self) -> Raw:
        depth = 1 << self.fdp.ConsumeIntInRange(4, 17)
        if self.fdp.ConsumeBool():
            return Raw("[" * depth + "]" * depth)
        return Raw('{"a":' * depth + "0" + "}" * depth)

    def body(self) -> bytes:
        """No body, a valid one, one with bad tensors, or broken safetensors bytes."""
        from safetensors.torch import save

        match self.fdp.ConsumeIntInRange(0, 6):
            case 0:
                return b""
            case 1 | 2:
                return save(self.peer.tensors)
            case 3:
                return save(self.bad_tensors())
            case 4:
                return self.fdp.ConsumeBytes(self.fdp.ConsumeIntInRange(0, 512))
            case 5:
                return self.corrupt(save(self.peer.tensors))
            case _:
                return self.fake_safetensors()

    def bad_tensors(self) -> dict:
        """The peer's tensors with one broken: values, shape, dtype, a name missing or added."""
        import torch

        tensors = {k: v.clone() for k, v in self.peer.tensors.items()}
        name = self.fdp.PickValueInList(sorted(tensors))
        match self.fdp.ConsumeIntInRange(0, 6):
            case 0:
                tensors[name].view(-1)[0] = self.fdp.PickValueInList([math.nan, math.inf, -math.inf])
            case 1:
                tensors[name] = tensors[name] * self.fdp.PickValueInList([1e3, 1e30, -1.0, 0.0])
            case 2:
                tensors[name] = tensors[name].reshape(-1)[: self.fdp.ConsumeIntInRange(0, tensors[name].numel())]
            case 3:
                tensors[name] = tensors[name].to(getattr(torch, self.fdp.PickValueInList(self.DTYPES)))
            case 4:
                del tensors[name]
            case 5:
                tensors["extra." + self.fdp.ConsumeUnicodeNoSurrogates(16)] = torch.zeros(2)
            case _:
                tensors[name] = torch.zeros(0)
        return tensors

    def corrupt(self, data: bytes) -> bytes:
        """Valid safetensors bytes with one byte changed, or cut short."""
        at = self.fdp.ConsumeIntInRange(0, len(data) - 1)
        if self.fdp.ConsumeBool():
            return data[:at]
        return data[:at] + bytes([self.fdp.ConsumeIntInRange(0, 255)]) + data[at + 1 :]

    def fake_safetensors(self) -> bytes:
        """A safetensors blob whose own JSON header is hostile (offsets, dtypes, shapes)."""
        entry = {"dtype": self.fdp.PickValueInList(["F32", "F64", "I64", "BOOL", "XX", ""]),
                 "shape": [self.fdp.ConsumeIntInRange(-1, 2**40) for _ in range(self.fdp.ConsumeIntInRange(0, 3))],
                 "data_offsets": [self.fdp.ConsumeIntInRange(0, 2**40), self.fdp.ConsumeIntInRange(0, 2**40)]}
        if self.fdp.ConsumeBool():
            entry[self.fdp.PickValueInList(["dtype", "shape", "data_offsets"])] = self.value(1)
        meta = to_json({"w": entry}).encode("utf-8", "surrogatepass")
        data = self.fdp.ConsumeBytes(self.fdp.ConsumeIntInRange(0, 256))
        return struct.pack("<Q", len(meta)) + meta + data


# --- the known poison messages of issue 12 ---------------------------------------------------


def known_inputs() -> dict[str, list[bytes]]:
    """The probe's poison messages as corpus entries, by folder: ``decode`` ones must not crash
    the decoder; ``reject`` ones (out-of-range integers, values a lax parser coerces) it must
    refuse with ``ProtocolError``."""
    peer = Peer("test", "0" * 32, {})
    update = with_body({**valid_header("update", peer, 1), "sender": "client02"}, b"")
    hello = with_body({**valid_header("hello", peer, 0), "sender": "client02"}, b"")
    return {
        "decode": [
            envelope(Raw("[" * 100_000 + "]" * 100_000), b""),
            envelope({**update, "n_samples": Raw("9" * 5000)}, b""),
        ],
        "reject": [
            envelope({**update, "n_samples": 2**63}, b""),
            envelope({**hello, "n_samples": 2**63}, b""),
            envelope({**update, "round": "3"}, b""),
            envelope({**update, "round": True}, b""),
            envelope({**update, "round": 2.0}, b""),
            envelope({**update, "n_samples": "100"}, b""),
        ],
    }


def write_known() -> list[Path]:
    """Put ``known_inputs`` into the corpus (named by content, so writing twice changes nothing)."""
    return [keep(CORPUS / folder, payload) for folder, payloads in known_inputs().items() for payload in payloads]


def keep(folder: Path, payload: bytes) -> Path:
    """Write ``payload`` into a corpus folder, named by the SHA-1 of its content."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha1(payload).hexdigest()}.bin"
    path.write_bytes(payload)
    return path


# --- the targets -------------------------------------------------------------------------------


def decode_crash(payload: bytes) -> BaseException | None:
    """What ``decode`` raised that it must not (anything but ``ProtocolError``), or None."""
    from edge_agent.protocol import ProtocolError, decode

    try:
        decode(payload, MAX_PAYLOAD)
    except ProtocolError:
        return None
    except Exception as err:  # noqa: BLE001 - every other exception is the finding
        return err
    return None


def make_agent(state_dir: Path):
    """A real agent on a bundled site with the tiny model of the service tests; its connection
    is built, not started. (Imported here: the fuzz worker instruments ``edge_agent`` first.)"""
    from edge_agent.agent import Agent
    from edge_agent.config import AgentConfig
    from tests.fleet import MODEL, TRAINING

    settings = {"fleet": "fuzz", "client_id": "gw01", "data": {"site": "miami"}, "model": MODEL,
                "training": TRAINING, "state_dir": str(state_dir)}
    return Agent(AgentConfig.model_validate(settings))


def agent_crash(agent, payload: bytes) -> BaseException | None:
    """What ``agent._handle`` let escape for ``payload`` on the round topic, or None."""
    from edge_agent.mqtt import Incoming

    try:
        agent._handle(Incoming(agent.topics.round, payload, mid=0, qos=1, retain=False))
    except Exception as err:  # noqa: BLE001 - any exception escaping the handler is the finding
        return err
    return None


def fresh_agent_crash(payload: bytes) -> BaseException | None:
    """``agent_crash`` on an agent that starts from nothing, as the regression test does."""
    with tempfile.TemporaryDirectory() as folder:
        return agent_crash(make_agent(Path(folder)), payload)


def crash_site(err: BaseException) -> str:
    """Where a crash happened: exception type and the innermost frame, for deduplication."""
    frame = traceback.extract_tb(err.__traceback__)[-1]
    return f"{type(err).__name__} at {Path(frame.filename).name}:{frame.lineno} ({frame.name})"


class Findings:
    """Crashes by site. A site that no corpus file shows yet gets one: the smallest payload of
    this run; files that were there before are never replaced (they may be known poison)."""

    def __init__(self, folder: Path, check: Callable[[bytes], BaseException | None]):
        self.folder, self.check = folder, check
        self.crashes = 0
        self.sites: dict[str, dict] = {}
        for path in sorted(folder.glob("*.bin")):
            payload = path.read_bytes()
            err = check(payload)
            if err is not None:
                self.sites.setdefault(crash_site(err), self._site(err, path.name, len(payload), before=True))

    @staticmethod
    def _site(err: BaseException, file: str | None, size: int | None, before: bool) -> dict:
        return {"count": 0, "file": file, "bytes": size, "message": str(err)[:200], "before": before}

    def record(self, err: BaseException, payload: bytes) -> None:
        self.crashes += 1
        site = crash_site(err)
        known = self.sites.setdefault(site, self._site(err, None, None, before=False))
        known["count"] += 1
        smaller = known["bytes"] is None or len(payload) < known["bytes"]
        if known["before"] or not smaller or self.check(payload) is None:
            return
        if known["file"]:
            (self.folder / known["file"]).unlink(missing_ok=True)
        known.update(file=keep(self.folder, payload).name, bytes=len(payload))


# --- the atheris worker ------------------------------------------------------------------------


class _Discard(logging.Handler):
    """Formats every record (a message that cannot be formatted is a finding too) and drops it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)


class Worker:
    """One target under atheris until ``inputs`` inputs have run; then its stats go to a file."""

    def __init__(self, target: str, inputs: int, stats: Path, workdir: Path):
        import atheris
        import torch

        self.target, self.inputs, self.stats, self.workdir = target, inputs, stats, workdir
        self.done = 0
        self.started = time.perf_counter()
        self.agent = None
        self.provider = atheris.FuzzedDataProvider
        if target == "agent":
            self.agent = make_agent(self._state_dir())
            self.peer = Peer(self.agent.cfg.fleet, self.agent.learner.signature, self.agent.learner.wire_state(0))
            self.findings = Findings(CORPUS / target, fresh_agent_crash)
        else:
            generator = torch.Generator().manual_seed(0)
            tensors = {"w": torch.randn(4, 3, generator=generator), "b": torch.zeros(3)}
            self.peer = Peer("fuzz", "0" * 32, tensors)
            self.findings = Findings(CORPUS / target, decode_crash)

    def _state_dir(self) -> Path:
        """A fresh folder per agent, named by how many inputs ran before it (same on every run)."""
        return self.workdir / f"agent-{self.done}"

    def __call__(self, data: bytes) -> None:
        payload = Envelopes(self.provider(data), self.peer).build()
        if self.agent is not None:
            if self.done and self.done % AGENT_EPOCH == 0:
                self.agent = make_agent(self._state_dir())
            err = agent_crash(self.agent, payload)
        else:
            err = decode_crash(payload)
        if err is not None:
            self.findings.record(err, payload)
        self.done += 1
        if self.done >= self.inputs:
            self.finish()

    def finish(self) -> None:
        """Write the stats, remove the agents' state folders and leave at once (libFuzzer has no
        way to return to the caller)."""
        seconds = time.perf_counter() - self.started
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.stats.write_text(json.dumps({"target": self.target, "inputs": self.done, "crashes": self.findings.crashes,
                                          "seconds": round(seconds, 2), "sites": self.findings.sites}))
        os._exit(0)


def fuzz_target(target: str, inputs: int, seed: int, stats: Path) -> None:
    """Run one target under atheris in this process (which it ends)."""
    import atheris

    import torch  # noqa: F401 - heavy dependencies load before instrumentation, uninstrumented
    import pydantic  # noqa: F401
    import safetensors.torch  # noqa: F401

    with atheris.instrument_imports(include=["edge_agent"]):
        import edge_agent.agent  # noqa: F401
        import edge_agent.protocol  # noqa: F401
    logging.getLogger().addHandler(_Discard())
    logging.getLogger().setLevel(logging.DEBUG)
    torch.set_num_threads(1)
    worker = Worker(target, inputs, stats, Path(tempfile.mkdtemp(prefix="edgefl-fuzz-")))
    options = ["-max_len=512", "-len_control=10", "-timeout=300", "-rss_limit_mb=8192", "-print_final_stats=0"]
    atheris.Setup([sys.argv[0], f"-seed={seed}", *options], worker)
    atheris.Fuzz()


def run_fuzz(inputs: int, seed: int) -> dict:
    """Fuzz every target (``SHARES`` of ``inputs`` each, one process per target, one after the
    other): ``{"inputs", "crashes", "seconds", "inputs_per_second", "targets"}``."""
    targets = {}
    with tempfile.TemporaryDirectory() as folder:
        for target, share in SHARES.items():
            stats, log = Path(folder) / f"{target}.json", Path(folder) / f"{target}.log"
            with log.open("wb") as out:
                count = str(max(1, int(inputs * share)))
                subprocess.run([sys.executable, __file__, "--worker", target, "--inputs", count, "--seed", str(seed),
                                "--stats", str(stats)], stdout=out, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(seed)}, check=False)
            if not stats.is_file():
                raise RuntimeError(f"fuzz worker {target} died:\n{log.read_text(errors='replace')[-3000:]}")
            targets[target] = json.loads(stats.read_text())
    total = {key: sum(t[key] for t in targets.values()) for key in ("inputs", "crashes")}
    seconds = round(sum(t["seconds"] for t in targets.values()), 1)
    return {**total, "seconds": seconds, "inputs_per_second": round(total["inputs"] / seconds), "targets": targets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs over all targets")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--known", action="store_true", help="write the poison messages of issue 12 into the corpus")
    parser.add_argument("--worker", choices=sorted(SHARES), help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        fuzz_target(args.worker, args.inputs, args.seed, args.stats)
        return
    if args.known:
        print("\n".join(str(path.relative_to(ROOT)) for path in write_known()))
        return
    result = run_fuzz(args.inputs, args.seed)
    for target, stats in result["targets"].items():
        print(f"{target}: {stats['inputs']} inputs, {stats['crashes']} crashes in {stats['seconds']} s")
        for site, info in stats["sites"].items():
            print(f"  {info['count']:>6} x {site}: {info['message'][:100]}  -> {info['file']}")
    print(json.dumps({k: result[k] for k in ("inputs", "crashes", "seconds", "inputs_per_second")}))


if __name__ == "__main__":
    main()
