"""``edgefl replay``: a CSV file or a bundled weather station published as live sensor readings over MQTT.

Lets anyone watch a live gateway without hardware. Three payload styles mimic real sensor fleets
(one number per topic, zigbee2mqtt and Tasmota JSON). Timestamps without a zone (the bundled sites,
most CSVs) are taken as UTC.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import numpy as np
import typer

from edge_agent.broker_settings import QOS, BrokerConfig
from edge_agent.data import DataError, GapPolicy
from edge_agent.data.errors import file_not_found
from edgefl.errors import LazyConsole, fail, reported
from edgefl.model_options import ModelOptions

if TYPE_CHECKING:
    import pandas as pd

    from edge_agent.data import SeriesTable

DEFAULT_PREFIX = "sensors"
OPTIONS = ModelOptions({GapPolicy: ("fill", "max_fill_steps"),
                       BrokerConfig: ("host", "port", "username", "password", "tls_ca")}, names={})
DEFAULT_SENSOR = "REPLAY"
CONNECT_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 30.0
LONG_REPLAY_ROWS = 100

console = LazyConsole(soft_wrap=True)


class Style(str, Enum):
    """How readings are laid out on the wire: a number per topic, or one JSON message per row."""

    plain = "plain"
    zigbee2mqtt = "zigbee2mqtt"
    tasmota = "tasmota"


class BrokerError(RuntimeError):
    """The broker cannot be reached, refuses us, or does not acknowledge what we published."""


@dataclass
class ReplayStats:
    """What a replay published: rows gone through, readings (values) and messages, wall seconds."""

    rows: int = 0
    readings: int = 0
    messages: int = 0
    seconds: float = 0.0
    interrupted: bool = False


def utc(timestamp: pd.Timestamp) -> pd.Timestamp:
    """``timestamp`` in UTC; a timestamp without a zone is taken as UTC already."""
    return timestamp.tz_localize("UTC") if timestamp.tzinfo is None else timestamp.tz_convert("UTC")


def rebase_shift(last_end: pd.Timestamp, now: pd.Timestamp) -> timedelta:
    """The whole number of days that moves ``last_end`` (the end of the last row's interval) onto the
    latest time <= ``now`` with the same time of day: daily cycles (sunshine) stay aligned with the
    clock, and every row's interval has ended, so a gateway can use every row at once."""
    return (utc(now) - utc(last_end)) // timedelta(days=1) * timedelta(days=1)


def messages(style: Style | str, device: str, timestamp: pd.Timestamp, row: dict[str, float],
             prefix: str = DEFAULT_PREFIX, sensor: str = DEFAULT_SENSOR) -> list[tuple[str, bytes]]:
    """The (topic, payload) pairs of one row; NaN cells are left out, an all-NaN row sends nothing.

    Numbers are ``repr`` of the float32 value as a Python float, so they parse back to the same float32.
    """
    values = {column: float(np.float32(value)) for column, value in row.items() if not math.isnan(value)}
    if not values:
        return []
    when = utc(timestamp).tz_localize(None)
    style = Style(style)
    if style is Style.plain:
        return [(f"{prefix}/{device}/{column}", repr(value).encode()) for column, value in values.items()]
    if style is Style.zigbee2mqtt:
        body = {**values, "last_seen": when.isoformat(timespec="milliseconds") + "Z"}
        return [(f"zigbee2mqtt/{device}", _json(body))]
    return [(f"tele/{device}/SENSOR", _json({"Time": when.isoformat(timespec="seconds"), sensor: values}))]


def _json(body: dict) -> bytes:
    """Compact JSON, as zigbee2mqtt and Tasmota send it."""
    return json.dumps(body, separators=(",", ":")).encode()


class Publisher:
    """A paho MQTT 5 client that publishes at QoS 1 and counts the broker's acknowledgements."""

    def __init__(self, broker: BrokerConfig):
        from edge_agent.mqtt import paho_client  # here: the CLI's other commands start without paho

        self.broker, self.where = broker, f"{broker.host}:{broker.port}"
        self.sent = self.acked = 0
        self.refused: str | None = None
        self.rejected: list[str] = []
        self.answered, self.acks = threading.Event(), threading.Condition()
        self.client = paho_client(f"edgefl-replay-{uuid.uuid4().hex[:8]}", broker=broker)
        self.client.on_connect = self._on_connect
        self.client.on_publish = self._on_publish

    def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Connect and wait for the broker's answer; BrokerError says why not."""
        try:
            self.client.connect(self.broker.host, self.broker.port, self.broker.keepalive_s)
        except (OSError, ValueError) as exc:
            raise BrokerError(f"cannot reach the broker at {self.where}: {exc}") from exc
        self.client.loop_start()
        if not self.answered.wait(timeout_s) or self.refused:
            self.close()
            hint = "" if self.broker.tls_ca else " (a TLS listener? then pass --tls-ca)"
            raise BrokerError(f"the broker at {self.where} refused the connection: {self.refused}" if self.refused
                              else f"cannot reach the broker at {self.where}: no answer within {timeout_s:g} s{hint}")

    def publish(self, topic: str, payload: bytes) -> None:
        self.client.publish(topic, payload, qos=QOS)
        self.sent += 1

    def finish(self, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Wait until the broker acknowledged every message, disconnect, and raise if it did not
        acknowledge or refused some (an ACL that forbids the topics answers 'Not authorized')."""
        with self.acks:
            self.acks.wait_for(lambda: self.acked >= self.sent, timeout_s)
            missing = self.sent - self.acked
        self.close()
        problems = [f"did not acknowledge {missing} (in {timeout_s:g} s)"] if missing else []
        if self.rejected:
            problems.append(f"refused {len(self.rejected)} ({', '.join(sorted(set(self.rejected)))})")
        if problems:
            raise BrokerError(f"of {self.sent} messages the broker at {self.where} {' and '.join(problems)}")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, _client, _userdata, _flags, reason_code, _props) -> None:
        self.refused = str(reason_code) if reason_code.is_failure else None
        self.answered.set()

    def _on_publish(self, _client, _userdata, _mid, reason_code, _props) -> None:
        with self.acks:
            self.acked += 1
            if reason_code.is_failure:
                self.rejected.append(str(reason_code))
            self.acks.notify_all()


def replay(table: SeriesTable, style: Style | str, broker: BrokerConfig, speedup: float, device: str,
           prefix: str = DEFAULT_PREFIX, sensor: str = DEFAULT_SENSOR, shift: timedelta = timedelta(0),
           on_message: Callable[[str, bytes], None] | None = None,
           on_row: Callable[[], None] | None = None) -> ReplayStats:
    """Publish every row of ``table`` stamped with its time + ``shift``, paced on a monotonic clock at
    ``speedup`` data seconds per wall second (0: no waiting), then wait for every acknowledgement.
    Ctrl-C stops early: the stats say so and count what was published."""
    check_speedup(speedup)
    publisher, stats = Publisher(broker), ReplayStats()
    publisher.connect()
    start = time.monotonic()
    try:
        for values, when in zip(table.values, table.index):
            _wait_until(start, (when - table.index[0]).total_seconds(), speedup)
            for topic, payload in messages(style, device, when + shift, dict(zip(table.columns, values)), prefix, sensor):
                publisher.publish(topic, payload)
                stats.messages += 1
                if on_message:
                    on_message(topic, payload)
            stats.rows += 1
            stats.readings += int(np.isfinite(values).sum())
            if on_row:
                on_row()
    except KeyboardInterrupt:
        stats.interrupted = True
    publisher.finish()
    stats.seconds = time.monotonic() - start
    return stats


def check_speedup(speedup: float) -> None:
    """Refuse a negative speedup (time cannot run backwards)."""
    if speedup < 0:
        raise DataError(f"--speedup must be >= 0 (0: as fast as possible), got {speedup:g}")


def _wait_until(start: float, data_seconds: float, speedup: float) -> None:
    """Sleep until ``data_seconds`` of data time have passed since ``start`` at ``speedup``."""
    if speedup:
        time.sleep(max(0.0, start + data_seconds / speedup - time.monotonic()))


def load_table(site: str | None, csv: Path | None, date_column: str | None, gaps: GapPolicy) -> SeriesTable:
    """The bundled weather site or the CSV file to replay (exactly one of them)."""
    if (site is None) == (csv is None):
        raise DataError("give either --site NAME (see edgefl sites) or --csv PATH")
    if site is not None and gaps != GapPolicy():
        raise DataError("--fill and --max-fill-steps apply to --csv (the bundled weather sites have no gaps)")
    if csv is not None and not csv.is_file():
        raise file_not_found(csv)
    from edge_agent.data import load_csv, load_site  # here: pvlib (the sites) is heavy; edgefl's entry stays light

    return load_site(site) if site is not None else load_csv(csv, date_column, gaps=gaps)


def pick_rows(table: SeriesTable, rows: int | None, start_row: int | None) -> SeriesTable:
    """``rows`` rows from ``start_row`` (0-based); without ``start_row`` the last ``rows`` rows."""
    if rows is not None and rows < 1:
        raise DataError(f"--rows must be >= 1, got {rows}")
    if start_row is not None and not 0 <= start_row < table.n_rows:
        raise DataError(f"--start-row must be in 0..{table.n_rows - 1}, got {start_row}")
    first = start_row if start_row is not None else max(0, table.n_rows - (rows or table.n_rows))
    cut = slice(first, None if rows is None else first + rows)
    return replace(table, index=table.index[cut], values=table.values[cut], observed=table.observed[cut], gaps=None)


def check_levels(what: str, names: Sequence[str]) -> None:
    """Refuse names that cannot be MQTT topic levels (empty, or with ``+``, ``#`` or ``/``)."""
    for name in names:
        if not name or any(c in name for c in "+#/\0"):
            raise DataError(f"{what} '{name}' cannot be an MQTT topic level (no '+', '#', '/', not empty)")


def plan(table: SeriesTable, style: Style, device: str, prefix: str, sensor: str, shift: timedelta,
         broker: BrokerConfig, speedup: float) -> str:
    """The first line: what is published where, over which times and how fast."""
    topics = [topic for topic, _ in messages(style, device, table.index[0], dict.fromkeys(table.columns, 0.0),
                                             prefix, sensor)]
    stem = topics[0][:topics[0].rfind("/") + 1] if len(topics) > 1 else ""
    where = f"{stem}{{{','.join(t[len(stem):] for t in topics)}}}" if stem else topics[0]
    times = f"{utc(table.index[0] + shift):%Y-%m-%d %H:%M} .. {utc(table.index[-1] + shift):%Y-%m-%d %H:%M} UTC"
    rebased = f" (the data's times + {shift.days} days)" if shift else ""
    pace = f"speedup {speedup:g}" if speedup else "as fast as possible"
    return (f"replaying {table.n_rows} row{'s' * (table.n_rows != 1)} of {table.name} as {style.value} device '{device}' to "
            f"{broker.host}:{broker.port} {where}: {times}{rebased}, {pace}")


def replay_command(
    site: Annotated[Optional[str], typer.Option(help="bundled weather site (see edgefl sites)")] = None,
    csv: Annotated[Optional[Path], typer.Option("--csv", help="your own CSV (date column + numeric columns)")] = None,
    date_column: Annotated[Optional[str], typer.Option(help="name of the date column in --csv")] = None,
    columns: Annotated[Optional[str], typer.Option(help="comma-separated columns to publish (default all)")] = None,
    rows: Annotated[Optional[int], typer.Option(help="publish this many rows (default: all; without --start-row the last ones)")] = None,
    start_row: Annotated[Optional[int], typer.Option(help="first row to publish (0-based)")] = None,
    style: Annotated[str, typer.Option(help="plain: <prefix>/<device>/<column> with the number as text, no "
                                       "timestamp (the receiver stamps arrival time) | zigbee2mqtt: zigbee2mqtt/<device>, "
                                       "JSON with last_seen | tasmota: tele/<device>/SENSOR, JSON with Time (UTC)")] = "plain",
    device: Annotated[Optional[str], typer.Option(help="device name in the topics (default: site name or CSV file stem)")] = None,
    prefix: Annotated[str, typer.Option(help="plain: first topic levels")] = DEFAULT_PREFIX,
    sensor: Annotated[str, typer.Option(help="tasmota: the sensor's key in the JSON")] = DEFAULT_SENSOR,
    speedup: Annotated[float, typer.Option(help="data seconds per wall second (3600: an hourly row a second; 0: no waiting)")] = 3600.0,
    rebase: Annotated[bool, typer.Option(help="shift timestamps by whole days so the last row's interval ends at "
                                         "the latest past time with its time of day (--no-rebase: original times)")] = True,
    **settings: Any,
) -> None:
    """Publish a CSV file or a bundled weather station as live sensor readings to an MQTT broker (QoS 1).
    Timestamps without a zone are taken as UTC."""
    with reported(DataError, flags=OPTIONS.flags):
        if style not in Style.__members__:
            raise DataError(f"unknown --style '{style}'; choose {', '.join(Style.__members__)}")
        kind = Style(style)
        check_speedup(speedup)
        table = load_table(site, csv, date_column, GapPolicy(**OPTIONS.values(GapPolicy, settings)))
        table = pick_rows(table.select(columns.split(",")) if columns else table, rows, start_row)
        name = device or site or csv.stem
        check_levels("--device", [name])
        if kind is Style.plain:
            check_levels("--prefix level", prefix.split("/"))
            check_levels("column", table.columns)
        broker = BrokerConfig(**OPTIONS.values(BrokerConfig, settings))
    import pandas as pd  # a table is a pandas table: the sites and CSV files need the gateway extra anyway
    from rich.progress import MofNCompleteColumn, Progress

    from edge_agent.data.table import sampling_step

    last_end = table.index[-1] + (sampling_step(table) if table.n_rows > 1 else timedelta(0))
    shift = rebase_shift(last_end, pd.Timestamp.now(tz="UTC")) if rebase else timedelta(0)
    console.print(plan(table, kind, name, prefix, sensor, shift, broker, speedup))
    try:
        with Progress(*Progress.get_default_columns(), MofNCompleteColumn(), console=console.rich, transient=True,
                      disable=table.n_rows <= LONG_REPLAY_ROWS or not console.is_terminal) as progress:
            task = progress.add_task("rows", total=table.n_rows)
            stats = replay(table, kind, broker, speedup, name, prefix, sensor, shift,
                           on_row=lambda: progress.advance(task))
    except BrokerError as exc:
        fail(str(exc))
    stopped = f"stopped by Ctrl-C after {stats.rows} of {table.n_rows} rows: " if stats.interrupted else ""
    console.print(f"{stopped}published {stats.readings} readings in {stats.messages} messages to "
                  f"{broker.host}:{broker.port} in {stats.seconds:.1f} s")
    if stats.interrupted:
        raise typer.Exit(130)


replay_command.__signature__ = OPTIONS.signature(replay_command)
