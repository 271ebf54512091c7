"""``[http]`` of ``coordinator.toml``: where the dashboard and ``/metrics`` listen, the token
that guards them, and the limits that keep many, idle or guessing clients from locking it out.
Loopback only unless a token is set (the state of a fleet is not public)."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from coordinator.throttle import RateLimit

LOOPBACK_NAMES = {"localhost"}
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``; any other name or address reaches a network."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HttpSettings(BaseModel):
    """The dashboard's listener: ``host`` (default 127.0.0.1), ``port``, an optional bearer token
    and its limits (connections, idle time, wrong tokens per source address)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", min_length=1, max_length=253, description="address the dashboard listens "
                      "on; anything but loopback needs a token")
    port: int = Field(8008, ge=0, le=65535, description="0: any free port (logged at start)")
    token: SecretStr | None = Field(None, description=f"at least {MIN_TOKEN_CHARS} characters; required "
                                    "to listen on anything but loopback; sent as 'Authorization: Bearer' or ?token=")
    connection_limit: int = Field(500, ge=1, le=10_000, description="open connections served at once; more wait "
                                  "in the listen backlog until one closes")
    idle_timeout_s: int = Field(10, ge=1, le=3600, description="a connection with no traffic for this long is "
                                "closed (checked every second)")
    failed_tokens: RateLimit = Field(RateLimit(burst=5, every_s=60.0), description="wrong tokens one source "
                                     "address (an IPv6 /64) may send at once, then one per every_s; past that a wrong "
                                     "token is answered 429 with Retry-After (the right token is always accepted)")
    trusted_proxy: str | None = Field(None, description="address of the reverse proxy in front of the dashboard "
                                      "(e.g. 127.0.0.1): a request from it is counted against the client its "
                                      "X-Forwarded-For names (its last hop); other peers' proxy headers are ignored")

    @field_validator("trusted_proxy")
    @classmethod
    def _address(cls, proxy: str | None) -> str | None:
        if proxy is not None:
            try:
                ipaddress.ip_address(proxy)
            except ValueError:
                raise ValueError(f"{proxy!r} is not an IP address (the proxy's, e.g. 127.0.0.1)") from None
        return proxy

    @model_validator(mode="after")
    def _guarded_off_loopback(self) -> "HttpSettings":
        if self.token is not None and len(self.token.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError(f"token: at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 16`)")
        if self.token is None and not is_loopback(self.host):
            raise ValueError(f"host {self.host!r} is reachable from the network: set a token "
                             "(or listen on 127.0.0.1)")
        return self

    @classmethod
    def parse_address(cls, address: str, configured: "HttpSettings | None" = None) -> "HttpSettings":
        """``HOST:PORT`` (``[::1]:PORT`` for IPv6) from the command line, keeping the rest of the
        ``configured`` settings (token and limits)."""
        host, sep, port = address.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"--http {address!r}: expected HOST:PORT")
        kept = dict(configured) if configured is not None else {}
        try:
            return cls(**{**kept, "host": host.strip("[]") or "127.0.0.1", "port": int(port)})
        except ValidationError as err:
            raise ValueError(f"--http {address!r}: {'; '.join(e['msg'] for e in err.errors())}") from None
