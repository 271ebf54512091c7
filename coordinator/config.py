"""``coordinator.toml``: one strict model for the coordinator service's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from coordinator.observe.settings import HttpSettings
from coordinator.pretraining import check_pretraining, with_fleet_foundation
from coordinator.strategy_settings import StrategySettings
from coordinator.throttle import IntakeLimits
from coordinator.twin_settings import TwinSettings
from edge_agent.broker_settings import DEFAULT_MAX_PAYLOAD_BYTES, BrokerConfig
from edge_agent.config import FleetModel
from edge_agent.limits import MAX_ROUND, NAME_PATTERN


SQLITE_FILE = "coordinator.sqlite3"  # in state_dir, without [store] url


class StoreSettings(BaseModel):
    """``[store]``: where the coordinator keeps its state. Without ``url``: SQLite and files in
    ``state_dir``; with a PostgreSQL URL: that database, so a standby coordinator can take over."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(None, max_length=2048,
                            description="postgresql://user[:password]@host[:port]/database (one database per fleet)")
    keep_rounds: int = Field(3, ge=1, le=MAX_ROUND, description="closed rounds whose bodies (updates as received, "
                             "personal messages, strategy state) are kept; older ones are deleted, their rows stay")
    keep_records: int | None = Field(1000, ge=1, le=MAX_ROUND, description="closed rounds whose records (update "
                                     "and event rows, the global state they were announced with) are kept; older "
                                     "ones are deleted and their late updates refused (code forgotten_round), so a "
                                     "long campaign's store stops growing; each round's own row and metrics stay; "
                                     "None: kept for ever")

    @model_validator(mode="after")
    def _records_outlive_bodies(self) -> "StoreSettings":
        if self.keep_records is not None and self.keep_records < self.keep_rounds:
            raise ValueError(f"keep_records ({self.keep_records}) must be at least keep_rounds ({self.keep_rounds}): "
                             "a body is kept only while its record is")
        return self

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is not a number in range
        except ValueError as err:
            raise ValueError(f"not a URL: {err}") from None
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"scheme {parts.scheme!r}: only postgresql:// URLs are supported (leave url out for SQLite)")
        if not parts.hostname:
            raise ValueError("no host: write postgresql://user@host:port/database")
        if not parts.path.strip("/") or "/" in parts.path.strip("/"):
            raise ValueError("no database name: write postgresql://user@host:port/database")
        return url


class CoordinatorConfig(FleetModel, TwinSettings, StrategySettings):
    """``coordinator.toml``: the fleet, the rounds, the model, the strategy and the broker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fleet: str = Field(pattern=NAME_PATTERN, description="the fleet's name, as in every agent.toml: its MQTT topics "
                                                         "are under edgefl/<fleet>/")
    state_dir: Path = Field(description="folder of the coordinator's state, created if missing: the SQLite database "
                                        "(unless store.url is set) and, in pretrain mode, foundation.safetensors; "
                                        "one campaign per folder")
    rounds: int = Field(10, ge=1, le=MAX_ROUND, description="rounds in the campaign; it ends after the last (a site "
                        "aggregator refuses this key: the central coordinator decides)")
    min_clients: int = Field(1, ge=0, description="quorum: updates needed to close a round (0: a round closes at "
                             "its deadline even if none came, the digital twins standing in for every client)")
    start_clients: int = Field(0, ge=0, description="hold round 1 until this many clients have registered")
    round_timeout_s: float = Field(300.0, gt=0, description="deadline of a round after its announcement")
    max_payload_bytes: int = Field(DEFAULT_MAX_PAYLOAD_BYTES, ge=1024, description="largest MQTT message accepted, "
                                   "in bytes; the broker's max_packet_size less the MQTT headers, and every agent's "
                                   "max_payload_bytes")
    registration: Literal["open", "closed"] = Field("open", description="open: any client may register; closed: "
                                                    "only those in allowed_clients")
    allowed_clients: list[str] = Field(default_factory=list, description="client ids that may register and send "
                                       "when registration is closed; reloaded on SIGHUP or when the file changes")
    seed: int = Field(42, description="base of the coordinator's seed streams: the initial global model, client "
                                      "sampling and the strategy's own draws")
    linger_s: float = Field(30.0, ge=0, description="after the last round, how long to wait for the clients to say "
                            "they went offline (so status tells the truth)")
    broker: BrokerConfig = BrokerConfig()
    intake: IntakeLimits = Field(IntakeLimits(), description="per-client rate limits on hellos and updates")
    http: HttpSettings | None = Field(None, description="the dashboard, JSON API and /metrics (off unless set)")
    store: StoreSettings = StoreSettings()

    @model_validator(mode="before")
    @classmethod
    def _default_strategy(cls, data: object) -> object:
        """Prompt mode aggregates with FedPoD unless a strategy is named; pretrain mode with FeDaL
        where FeDaL's device side is set, else FedAvg; FeDaL's server pretrains the fleet's model."""
        if not isinstance(data, dict) or "strategy" in data:
            return with_fleet_foundation(data)
        if data.get("mode") == "prompt":
            return {**data, "strategy": "fedpod"}
        if data.get("mode") == "pretrain" and data.get("fedal_client") is not None:
            return with_fleet_foundation({**data, "strategy": "fedal"})
        return data

    @model_validator(mode="after")
    def _check(self) -> "CoordinatorConfig":
        if self.strategy == "fedpod" and self.mode != "prompt":
            raise ValueError("strategy 'fedpod' personalizes prompts: it needs mode = 'prompt'")
        check_pretraining(self, self)
        if self.registration == "closed" and not self.allowed_clients:
            raise ValueError("registration is closed but allowed_clients is empty")
        if self.registration == "closed" and self.start_clients > len(self.allowed_clients):
            raise ValueError(f"start_clients: {self.start_clients} can never register; "
                             f"allowed_clients lists {len(self.allowed_clients)}")
        return self


UPLINK = "uplink/"  # on a site broker, the central broker's topics appear under this prefix (the bridge maps them)


class AggregatorConfig(CoordinatorConfig):
    """``aggregator.toml``: a site aggregator (``edgefl aggregator serve``). The coordinator's
    fields for its own gateways and broker; the rounds are the central coordinator's, which
    reaches it through the site broker's bridge (topics under ``uplink/``)."""

    site: str = Field(pattern=NAME_PATTERN, description="this site's client id at the central coordinator")
    deadline_margin_s: float = Field(10.0, ge=0, description="close a round this long before the central "
                                     "deadline, so the site's update arrives in time")

    @model_validator(mode="after")
    def _site_rules(self) -> "AggregatorConfig":
        if self.mode == "prompt":
            raise ValueError("mode 'prompt' (FedPoD) is not supported over sites yet: its personal messages are "
                             "per gateway; run prompt-mode gateways on the central broker")
        if self.strategy != "fedavg":
            raise ValueError(f"strategy {self.strategy!r}: a site combines its gateways with 'fedavg' only (a "
                             "partial weighted mean); set the fleet's strategy at the central coordinator")
        if "rounds" in self.model_fields_set:
            raise ValueError("rounds: the central coordinator decides the rounds")
        if self.participation.buffering is not None:
            raise ValueError("participation.policy 'buffered': a site closes on the central round's deadline (a "
                             "partial FedAvg); set the fleet's round policy at the central coordinator")
        if self.store.url is not None:
            raise ValueError("store.url: a site aggregator keeps its state in SQLite in state_dir (the leader "
                             "lease on PostgreSQL is per fleet, which the central coordinator holds)")
        return self
