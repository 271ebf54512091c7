"""``edgefl broker-config``: a mosquitto setup for one fleet, with per-agent credentials and ACL.

Each agent may publish only its own hello/update/status topics and read only its own task topic,
the round announcement and the coordinator's presence; the coordinator reads every agent topic
and writes the task topics and the round. Optional TLS with a CA this module creates.

Against a buggy or hostile device with valid credentials the broker itself enforces:

- client id = username (``use_username_as_clientid``): a device connecting with another
  client's id gets its own username as id, so it cannot kick the victim off or take over its
  persistent session (it can only replace its own connection);
- ``max_packet_size`` = the fleet's ``max_payload_bytes`` (by default its largest legal message,
  ``edge_agent.learners.largest_message``) plus the MQTT headers: a bigger packet is refused as its
  fixed header arrives, before the broker buffers it, and its sender is disconnected, so it never
  reaches the coordinator nor the retained store (mosquitto 2.0's ``message_size_limit`` refuses
  only after reading the whole packet into memory);
- queues sized for the fleet (``max_queued_messages``, ``max_inflight_messages``), so a burst of
  honest updates is held for the coordinator instead of silently dropped.

mosquitto 2.0 cannot refuse the retain flag per topic or per listener (its ACL restricts topics
only; ``retain_available false`` is broker-wide and would refuse the coordinator's retained round
and presence too), so a device can keep one retained message, at most ``max_packet_size`` bytes,
on each of its own three topics, and nowhere else. The coordinator subscribes to hello/update
with MQTT 5 retain handling 2 (the broker never replays their retained copies to it, at any
resubscribe) and ignores a retained one all the same; a retained status is presence and is used.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_agent.broker_settings import COORDINATOR_RECEIVE_WINDOW
from edge_agent.config import FleetModel, dump_toml
from edge_agent.storage import write_bytes_atomically
from edge_agent.topics import Topics

COORDINATOR_USER = "coordinator"
BROKER_ACCOUNT = "mosquitto"  # the account Debian's mosquitto package creates and drops to
PERSISTENCE_DIR = "data"  # mosquitto.db, in a folder of its own: saving needs a writable folder
SECRET_MODE = 0o600  # passwords, keys and configs holding credentials: owner only, from the first byte
QUEUED_PER_AGENT = 200  # messages the broker holds for the coordinator per agent (it may be down a while)
MIN_QUEUED = 10_000
MQTT_HEADERS = 1024  # a PUBLISH beyond its payload: fixed header, topic (under 200 bytes here), packet id, properties


def mosquitto_password_hash(password: str, salt: bytes | None = None) -> str:
    """The ``$7$`` PBKDF2-SHA512 format of mosquitto 2.x password files (101 iterations)."""
    salt = salt or secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, 101)
    return f"$7$101${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def acl_text(fleet: str, agent_ids: list[str], coordinator_extra: tuple[str, ...] = ()) -> str:
    """One block per user: least privilege for each agent, the coordinator's role for itself
    (plus ``coordinator_extra`` ACL lines: a site aggregator's uplink topics)."""
    topics = Topics(fleet)
    lines = [f"user {COORDINATOR_USER}"]
    lines += [f"topic read {topics.agents(leaf)}" for leaf in ("hello", "update", "status")]
    lines += [f"topic write {topics.root}/agents/+/task", f"topic readwrite {topics.round}",
              f"topic readwrite {topics.coordinator_status}", *coordinator_extra, ""]
    for agent in agent_ids:
        lines += [
            f"user {agent}",
            f"topic write {topics.agent(agent, 'hello')}",
            f"topic write {topics.agent(agent, 'update')}",
            f"topic readwrite {topics.agent(agent, 'status')}",
            f"topic read {topics.agent(agent, 'task')}",
            f"topic read {topics.round}",
            f"topic read {topics.coordinator_status}",
            "",
        ]
    return "\n".join(lines)


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_tls(out: Path, host: str, days: int = 825) -> TlsFiles:
    """A private CA and a server certificate for ``host`` (plus localhost/127.0.0.1) signed by it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("edgefl fleet CA")).issuer_name(_name("edgefl fleet CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(out / "ca.crt", out / "server.crt", out / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_bytes_atomically(files.server_key, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ), mode=SECRET_MODE)
    return files


def broker_user() -> str:
    """The account mosquitto runs as: where this process is root, ``mosquitto`` (given the
    broker's files by ``hand_to_broker``; root where no such account exists), else this process's
    own user, who owns the files (a broker started as root drops to it)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        return pwd.getpwnam(BROKER_ACCOUNT).pw_name
    except KeyError:
        return "root"


def hand_to_broker(*paths: Path) -> None:
    """As root: ``paths`` (config, passwords, ACL, key, persistence folder) to ``broker_user()``,
    so the broker reads and saves them started as root (it drops to that user) or as that user."""
    if os.geteuid() == 0:
        account = pwd.getpwnam(broker_user())
        for path in paths:
            os.chown(path, account.pw_uid, account.pw_gid)


def mosquitto_conf(out: Path, listener: list[str], n_agents: int, max_payload_bytes: int) -> str:
    """The broker config: authenticated listener, client ids bound to usernames, the packet
    limit and queues sized for ``n_agents`` (see the module docstring); it runs as
    ``broker_user()`` and keeps its database in ``out/data``."""
    return "\n".join([
        "# written by edgefl broker-config", f"user {broker_user()}", "per_listener_settings false", *listener,
        "use_username_as_clientid true", "allow_anonymous false",
        f"password_file {out / 'passwords'}", f"acl_file {out / 'acl'}",
        f"max_packet_size {max_payload_bytes + MQTT_HEADERS}",
        f"max_inflight_messages {COORDINATOR_RECEIVE_WINDOW}",
        f"max_queued_messages {max(MIN_QUEUED, QUEUED_PER_AGENT * n_agents)}",
        "persistence true", f"persistence_location {out / PERSISTENCE_DIR}/", "",
    ])


def write_fleet_setup(
    fleet: str, agent_ids: list[str], out: Path, host: str = "127.0.0.1", port: int = 1883,
    tls: bool = False, state_root: Path | None = None, max_payload_bytes: int | None = None,
    sites: list[str] | None = None, coordinator_settings: dict | None = None,
) -> dict[str, Path]:
    """Write mosquitto.conf, passwords, acl and one TOML per service, each with the fleet's
    ``[model]`` (the recipe's), so agents and coordinator build the same model as written;
    ``max_payload_bytes``: the largest message, for the broker and every service (default: the
    model's largest legal message); ``coordinator_settings``: more keys of coordinator.toml.
    Returns what was written.
    ``sites``: clients that are site aggregators (``edgefl aggregator serve``, bridged in): each
    gets the agent ACL and ``sites/<site>.toml`` with its bridge credentials instead of an agent
    config, and the coordinator weighs them by their summed count (``robust.site_clients``)."""
    sites = sites or []
    clients = [*agent_ids, *sites]
    if len(set(clients)) != len(clients) or COORDINATOR_USER in clients:
        raise ValueError(f"client ids must be unique and not {COORDINATOR_USER!r}: {clients}")
    acl = acl_text(fleet, clients)  # checks the fleet name and every id before anything is written
    out.mkdir(parents=True, exist_ok=True)
    users = {COORDINATOR_USER: secrets.token_urlsafe(18), **{a: secrets.token_urlsafe(18) for a in clients}}
    write_bytes_atomically(out / "passwords", "".join(
        f"{user}:{mosquitto_password_hash(password)}\n" for user, password in users.items()
    ).encode(), mode=SECRET_MODE)
    (out / "acl").write_text(acl)
    tls_files = make_tls(out, host) if tls else None
    listener = [f"listener {port} {host}"]
    if tls_files:
        listener += [f"cafile {tls_files.ca_cert}", f"certfile {tls_files.server_cert}",
                     f"keyfile {tls_files.server_key}", "tls_version tlsv1.2"]
    from edge_agent.learners import largest_message  # builds the model (torch): after the checks above

    fleet_model = FleetModel()
    max_payload_bytes = largest_message(fleet_model) if max_payload_bytes is None else max_payload_bytes
    (out / "mosquitto.conf").write_text(mosquitto_conf(out, listener, len(clients), max_payload_bytes))
    (out / PERSISTENCE_DIR).mkdir(mode=0o700, exist_ok=True)
    hand_to_broker(out / "mosquitto.conf", out / "passwords", out / "acl", out / PERSISTENCE_DIR,
                   *([tls_files.server_key] if tls_files else []))
    state_root = state_root or out / "state"
    broker = {"host": host, "port": port, "tls_ca": str(tls_files.ca_cert) if tls_files else None}
    model = fleet_model.model.model_dump(mode="json")
    written = {"mosquitto.conf": out / "mosquitto.conf", "passwords": out / "passwords", "acl": out / "acl"}
    coordinator = {
        "fleet": fleet, "state_dir": str(state_root / "coordinator"), "rounds": 10,
        "max_payload_bytes": max_payload_bytes,
        "min_clients": max(1, len(clients) // 2),
        "start_clients": max(1, len(agent_ids) // 2 + len(sites)),  # every site: each stands for many gateways
        "registration": "closed", "allowed_clients": clients,
        "broker": {**broker, "username": COORDINATOR_USER, "password": users[COORDINATOR_USER]},
        **({"robust": {"site_clients": sites}} if sites else {}), **(coordinator_settings or {}), "model": model,
    }
    written["coordinator.toml"] = out / "coordinator.toml"
    write_bytes_atomically(written["coordinator.toml"], dump_toml(coordinator).encode(), mode=SECRET_MODE)
    for site in sites:
        written[f"{site}.toml"] = out / "sites" / f"{site}.toml"
        written[f"{site}.toml"].parent.mkdir(exist_ok=True)
        credentials = {"username": site, "password": users[site], "tls_ca": broker["tls_ca"]}
        write_bytes_atomically(written[f"{site}.toml"], dump_toml(credentials).encode(), mode=SECRET_MODE)
    from edge_agent.data import list_sites  # here: its module loads pandas, which the checks above need not

    stations = list_sites()
    for index, agent in enumerate(agent_ids):
        config = {
            "fleet": fleet, "client_id": agent, "state_dir": str(state_root / agent), "client_index": index,
            "max_payload_bytes": max_payload_bytes,
            "data": {"site": stations[index % len(stations)]}, "model": model,
            "broker": {**broker, "username": agent, "password": users[agent]},
        }
        written[f"{agent}.toml"] = out / "agents" / f"{agent}.toml"
        written[f"{agent}.toml"].parent.mkdir(exist_ok=True)
        write_bytes_atomically(written[f"{agent}.toml"], dump_toml(config).encode(), mode=SECRET_MODE)
    return written


def start_mosquitto(config: Path, workdir: Path) -> "subprocess.Popen[bytes]":
    """Run mosquitto on ``config`` with its log in ``workdir`` as the user running this (tests and
    the demo, in folders only they may enter): as root it stays root instead of the config's user."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(binary).is_file():
        raise FileNotFoundError("mosquitto is not installed (Debian/Ubuntu: apt-get install mosquitto)")
    workdir.mkdir(parents=True, exist_ok=True)
    wrapped = workdir / "mosquitto-run.conf"
    user = "user root\n" if os.geteuid() == 0 else ""
    own = "".join(line + "\n" for line in config.read_text().splitlines() if not line.startswith("user "))
    wrapped.write_text(f"{user}log_dest file {workdir / 'mosquitto.log'}\nlog_type all\n{own}")
    return subprocess.Popen([binary, "-c", str(wrapped)], stderr=subprocess.PIPE)


def wait_for_port(port: int, process: "subprocess.Popen[bytes]", timeout: float = 10) -> None:
    """Block until something listens on 127.0.0.1:``port`` (or the process dies)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"mosquitto exited: {process.stderr.read().decode() if process.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def free_port() -> int:
    """A loopback TCP port nobody uses right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
