"""``edgefl broker-config --site NAME --uplink HOST[:PORT]``: one site's broker, bridged to the
central broker with mosquitto's own bridge, its aggregator's config and its gateways' configs.

The site broker is a fleet broker of its own (``write_fleet_setup``: per-gateway credentials and
ACL) plus a bridge that logs in to the central broker as the site (credentials from the central
setup's ``sites/<site>.toml``, written by ``broker-config --sites``). The bridge remaps topics so
that the gateways' own updates never leave the site: only the central round, the central
coordinator's presence and the site's task topic come in (under ``uplink/``), and only the site's
hello/update/status go out.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from coordinator.broker_setup import SECRET_MODE, acl_text, hand_to_broker, write_fleet_setup
from coordinator.config import UPLINK
from edge_agent.config import dump_toml
from edge_agent.topics import Topics
from edge_agent.storage import write_bytes_atomically


def parse_uplink(text: str) -> tuple[str, int]:
    """``HOST[:PORT]`` -> (host, port); the port defaults to 1883."""
    host, _, port = text.rpartition(":") if ":" in text else (text, "", "1883")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--uplink: {text!r} is not HOST or HOST:PORT (port 1..65535)")
    return host, int(port)


def read_site_credentials(central: Path, site: str) -> dict:
    """The site's login on the central broker, from the central setup folder."""
    path = central / "sites" / f"{site}.toml"
    if not path.is_file():
        raise ValueError(f"{path}: not found; write the central setup with --sites {site} first")
    with path.open("rb") as file:
        credentials = tomllib.load(file)
    if not isinstance(credentials.get("username"), str) or not isinstance(credentials.get("password"), str):
        raise ValueError(f"{path}: needs username and password")
    return credentials


def bridge_section(fleet: str, site: str, host: str, port: int, credentials: dict) -> str:
    """The mosquitto bridge: central round, presence and our task in; our hello/update/status out."""
    central = Topics(fleet)
    incoming = [central.round, central.coordinator_status, central.agent(site, "task")]
    outgoing = [central.agent(site, leaf) for leaf in ("hello", "update", "status")]
    lines = [f"connection edgefl-{site}", f"address {host}:{port}",
             f"remote_username {credentials['username']}", f"remote_password {credentials['password']}",
             f"remote_clientid {credentials['username']}", "cleansession false", "notifications false",
             "bridge_protocol_version mqttv311"]
    if credentials.get("tls_ca"):
        lines.append(f"bridge_cafile {credentials['tls_ca']}")
    lines += [f'topic {topic} in 1 {UPLINK} ""' for topic in incoming]
    lines += [f'topic {topic} out 1 {UPLINK} ""' for topic in outgoing]
    return "\n".join(["", "# the bridge to the central broker (edgefl broker-config --site)", *lines, ""])


def write_site_setup(
    fleet: str, site: str, gateway_ids: list[str], out: Path, uplink: str, central: Path,
    host: str = "127.0.0.1", port: int = 1883, tls: bool = False, max_payload_bytes: int | None = None,
) -> dict[str, Path]:
    """Write the site broker's config (with the bridge), passwords, ACL, ``aggregator.toml`` and
    one agent config per gateway; returns what was written."""
    uplink_host, uplink_port = parse_uplink(uplink)
    credentials = read_site_credentials(central, site)
    written = write_fleet_setup(fleet, gateway_ids, out, host, port, tls, max_payload_bytes=max_payload_bytes)
    uplink_topics = Topics(fleet, UPLINK)
    (out / "acl").write_text(acl_text(fleet, gateway_ids, (f"topic readwrite {uplink_topics.root}/#",)))
    conf = written["mosquitto.conf"]  # holds the bridge's password from now on: owner only
    bridged = conf.read_text() + bridge_section(fleet, site, uplink_host, uplink_port, credentials)
    write_bytes_atomically(conf, bridged.encode(), mode=SECRET_MODE)
    hand_to_broker(conf)
    with written.pop("coordinator.toml").open("rb") as file:
        aggregator = tomllib.load(file)
    del aggregator["rounds"]
    aggregator.update(site=site, state_dir=str(out / "state" / "aggregator"), start_clients=len(gateway_ids))
    written["aggregator.toml"] = out / "aggregator.toml"
    write_bytes_atomically(written["aggregator.toml"], dump_toml(aggregator).encode(), mode=SECRET_MODE)
    (out / "coordinator.toml").unlink()
    return written
