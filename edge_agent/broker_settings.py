"""Where an MQTT broker is and how to log in (``[broker]`` of every config): free of paho and ssl,
so that configs are checked before the MQTT client (``edge_agent.mqtt``) loads."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
QOS = 1  # of every message the services and replay send
COORDINATOR_RECEIVE_WINDOW = 256  # unacknowledged messages the broker may hand the coordinator at once


class BrokerConfig(BaseModel):
    """Where the broker is and how to log in; TLS is on when ``tls_ca`` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="MQTT broker host name or IP address")
    port: int = Field(1883, ge=1, le=65535, description="MQTT broker TCP port")
    username: str | None = Field(None, description="MQTT user name, given with password (absent: no login)")
    password: str | None = Field(None, description="MQTT password, given with username")
    tls_ca: Path | None = Field(None, description="CA certificate that signed the broker's certificate")
    keepalive_s: int = Field(30, ge=5, description="MQTT keepalive in seconds: the broker drops a connection "
                                                   "silent for 1.5 times this")
    session_expiry_s: int = Field(7 * 24 * 3600, ge=0, description="how long the broker keeps our session")

    @model_validator(mode="after")
    def _check(self) -> "BrokerConfig":
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password must be given together")
        if self.tls_ca is not None and not self.tls_ca.is_file():
            raise ValueError(f"tls_ca: file not found: {self.tls_ca}")
        return self
