"""The edge agent: local data, local training for each announced round, only shared parameters out.

State kept in ``state_dir`` across restarts: the personal parameters (head, slot embeddings),
the last global shared parameters, the last round trained and an update not yet acknowledged
(re-sent after every reconnect until the coordinator answers).
"""

from __future__ import annotations

import importlib
import json
import logging
import queue
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file

from edge_agent.data import (
    TIME_FEATURES,
    SeriesTable,
    load_csv,
    load_site,
    prepare_client,
    time_features,
)
from edge_agent.learners import make_learner
from edge_agent.models import Forecaster, ModelConfig, build_forecaster
from edge_agent.models.prompts import PromptModeSettings
from edge_agent.mqtt import BrokerConfig, Connection, Incoming
from edge_agent.protocol import (
    NAME_PATTERN,
    HelloHeader,
    PersonalHeader,
    ProtocolError,
    ReplyHeader,
    RoundHeader,
    Topics,
    UpdateHeader,
    decode,
    encode,
)
from edge_agent.storage import write_bytes_atomically, write_tensors_atomically
from edge_agent.train import derive_seed

log = logging.getLogger("edgefl.agent")


class DataSource(BaseModel):
    """Local data: a CSV file (date column + numeric columns) or one bundled weather site."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    csv: Path | None = None
    date_column: str | None = None
    site: str | None = None
    columns: list[str] | None = Field(None, description="subset of columns to use (default: all)")

    @model_validator(mode="after")
    def _one_source(self) -> "DataSource":
        if (self.csv is None) == (self.site is None):
            raise ValueError("give exactly one of csv or site")
        return self

    def load(self) -> SeriesTable:
        table = load_csv(self.csv, self.date_column) if self.csv else load_site(self.site)
        return table.select(self.columns) if self.columns else table


class LocalTraining(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    local_epochs: int = Field(1, ge=1)
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0)
    stride: int = Field(1, ge=1, description="step between training windows")


class AgentConfig(PromptModeSettings):
    """``agent.toml``: who this gateway is, its data, its model and the broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str = Field(pattern=NAME_PATTERN)
    client_id: str = Field(pattern=NAME_PATTERN)
    state_dir: Path
    data: DataSource
    model: ModelConfig = ModelConfig()
    dp_sigma: float = Field(0.0, ge=0.0, description="prompt mode: std of Gaussian noise on uploaded prompts (privacy)")
    training: LocalTraining = LocalTraining()
    seed: int = 42
    client_index: int = Field(0, ge=0, description="this client's index in the fleet's seed schedule")
    max_payload_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    broker: BrokerConfig = BrokerConfig()


class Agent:
    """One gateway's training service."""

    def __init__(self, cfg: AgentConfig, on_event: Callable[[str, dict], None] | None = None):
        self.cfg = cfg
        self.topics = Topics(cfg.fleet)
        self.dir = Path(cfg.state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.table = cfg.data.load()
        self.learner = make_learner(cfg, self.table, self.dir)
        self.signature = self.learner.signature
        self.state = self._read_state()
        self.on_event = on_event or (lambda kind, data: None)
        self.finished = False
        self.connection = Connection(
            cfg.broker,
            client_id=f"edgefl-agent-{cfg.fleet}-{cfg.client_id}",
            will_topic=self.topics.agent(cfg.client_id, "status"),
            subscriptions=[
                self.topics.round, self.topics.agent(cfg.client_id, "task"), self.topics.coordinator_status
            ],
        )
        self.connection.on_connected.append(self._on_connected)

    # state on disk ---------------------------------------------------------------------------

    def _read_state(self) -> dict:
        path = self.dir / "agent.json"
        return json.loads(path.read_text()) if path.is_file() else {"trained_round": 0}

    def _write_state(self) -> None:
        write_bytes_atomically(self.dir / "agent.json", json.dumps(self.state).encode())

    @property
    def pending_path(self) -> Path:
        return self.dir / "pending_update.edfl"

    # lifecycle -------------------------------------------------------------------------------

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Serve rounds until the coordinator announces the end (or ``stop`` says so)."""
        importlib.import_module("torch._dynamo")  # torch optimizers load it on first use (~1.3 s): not in round 1
        self.connection.start()
        try:
            while not self.finished and not stop():
                try:
                    self._handle(self.connection.inbox.get(timeout=0.1))
                except queue.Empty:
                    pass
        finally:
            self.connection.stop(self.topics.agent(self.cfg.client_id, "status"))

    def _on_connected(self) -> None:
        """Presence, then registration and any update still waiting for its acknowledgement."""
        self.connection.publish(self.topics.agent(self.cfg.client_id, "status"), b"online", retain=True)
        self._introduce(resend=True)

    def _introduce(self, resend: bool) -> None:
        """Register; with ``resend`` also re-send an update still waiting for its answer.

        Called on every connect (resend), when the coordinator comes online (it may not have
        been subscribed to our hello yet; updates wait in its persistent session) and when it
        says it does not know us (resend)."""
        cid = self.cfg.client_id
        hello = HelloHeader(
            fleet=self.cfg.fleet, sender=cid, n_features=self.learner.n_features, n_samples=self.learner.n_samples,
            latitude=self.table.latitude, longitude=self.table.longitude, model_signature=self.signature,
        )
        self.connection.publish(self.topics.agent(cid, "hello"), encode(hello))
        if resend and self.pending_path.is_file():
            self.connection.publish(self.topics.agent(cid, "update"), self.pending_path.read_bytes())

    def _handle(self, message: Incoming) -> None:
        if message.topic == self.topics.coordinator_status:
            if message.payload == b"online":
                self._introduce(resend=False)
            return
        try:
            header, tensors = decode(message.payload, self.cfg.max_payload_bytes)
        except ProtocolError as err:
            log.warning("ignoring a bad message on %s: %s", message.topic, err)
            return
        if isinstance(header, RoundHeader):
            self._on_round(header, tensors)
        elif isinstance(header, ReplyHeader):
            self._on_reply(header)
        elif isinstance(header, PersonalHeader):
            self._on_personal(header, tensors)

    def _on_round(self, header: RoundHeader, global_state: dict) -> None:
        if header.model_signature != self.signature:
            log.error("coordinator runs another model (signature %s, ours %s)", header.model_signature, self.signature)
            self.on_event("signature_mismatch", {"round": header.round})
            return
        self.learner.load_global(global_state)
        write_tensors_atomically(self.dir / "global.safetensors", global_state)
        if header.finished:
            self.finished = True
            self.on_event("finished", {"round": header.round})
            return
        if header.round <= self.state["trained_round"]:
            return
        self._train_and_send(header.round)

    def _train_and_send(self, round_index: int) -> None:
        """Train for one round, make the result durable, then publish the shared part."""
        cfg = self.cfg
        started = time.perf_counter()
        loss = self.learner.train(round_index)
        header = UpdateHeader(
            fleet=cfg.fleet, sender=cfg.client_id, round=round_index, n_samples=self.learner.n_samples,
            metrics={"loss": loss, "seconds": time.perf_counter() - started},
        )
        payload = encode(header, self.learner.wire_state())
        self.learner.save()
        write_bytes_atomically(self.pending_path, payload)
        self.state["trained_round"] = round_index
        self._write_state()
        self.connection.publish(self.topics.agent(cfg.client_id, "update"), payload)
        self.on_event("sent", {"round": round_index, "loss": loss})

    def _on_personal(self, header: PersonalHeader, tensors: dict) -> None:
        """Prompt mode: the coordinator's personalized prompts after a round (FedPoD eq. 9)."""
        try:
            self.learner.install_personal(tensors)
        except (KeyError, ValueError, RuntimeError) as err:
            log.warning("ignoring personalized prompts for round %d: %s", header.round, err)
            return
        self.learner.save()
        self.on_event("personal", {"round": header.round})

    def _on_reply(self, reply: ReplyHeader) -> None:
        self.on_event("reply", reply.model_dump())
        if reply.code == "unknown_client":
            self._introduce(resend=True)
            return
        if reply.about != "update":
            if not reply.accepted:
                log.error("coordinator refused our %s: %s", reply.about, reply.reason)
            return
        if reply.accepted or reply.code == "duplicate":
            self.pending_path.unlink(missing_ok=True)
        if not reply.accepted:
            log.warning("update refused: %s", reply.reason)


def load_local_model(cfg: AgentConfig, n_features: int, state_dir: Path) -> Forecaster:
    """The agent's model with its personal (and last global) parameters restored from disk."""
    model = build_forecaster(
        cfg.model, n_features, TIME_FEATURES, derive_seed(cfg.seed, 1, cfg.client_index)
    )
    personal, shared = state_dir / "personal.safetensors", state_dir / "global.safetensors"
    if personal.is_file():
        model.load_state_dict(load_file(str(personal)), strict=False)
    if shared.is_file():
        model.load_shared_state(load_file(str(shared)))
    return model


@torch.no_grad()
def forecast(cfg: AgentConfig, onnx_model: Path | None = None) -> tuple[list[str], list[str], torch.Tensor]:
    """Forecast the horizon after the latest window of local data, in the data's own units,
    with the torch model or, given ``onnx_model`` (an ``edgefl export onnx`` model.onnx), ONNX Runtime.

    Returns (timestamps, column names, values of shape (H, F)).
    """
    table = cfg.data.load()
    data = prepare_client(table, cfg.model.lookback, cfg.model.horizon)
    series = data.scaler.transform(table.values[-cfg.model.lookback :]).astype("float32")[None]
    marks = time_features(table.index[-cfg.model.lookback :])[None]
    if onnx_model is None:
        model = load_local_model(cfg, data.n_features, Path(cfg.state_dir)).eval()
        scaled = model(torch.from_numpy(series), torch.from_numpy(marks))[0].numpy()
    else:
        scaled = run_onnx_forecast(Path(onnx_model), series, marks)[0]
    values = torch.as_tensor(data.scaler.inverse_transform(scaled))
    step = table.index[-1] - table.index[-2]
    stamps = [str(table.index[-1] + step * (h + 1)) for h in range(cfg.model.horizon)]
    return stamps, list(data.columns), values


def run_onnx_forecast(path: Path, series: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """The ``forecast`` output of an exported model; a model for other shapes is refused by name."""
    import onnxruntime

    if not path.is_file():
        raise ValueError(f"{path}: ONNX model not found")
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types for unreadable files
        raise ValueError(f"{path}: not a readable ONNX model ({err})") from None
    inputs = {i.name: i.shape for i in session.get_inputs()}
    for name, array in (("x", series), ("marks", marks)):
        if name not in inputs:
            raise ValueError(f"{path}: the model has no input {name!r} (inputs: {sorted(inputs)})")
        fixed = list(inputs[name][1:])
        if list(array.shape[1:]) != fixed:
            raise ValueError(f"{path}: input {name!r} expects (batch, {fixed}), this agent's data gives {array.shape}")
    return session.run(["forecast"], {"x": series, "marks": marks.astype(np.float32)})[0]
