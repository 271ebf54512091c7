"""``edgefl replay``: the exact wire formats, the day-aligned rebase, and real replays through mosquitto."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pandas as pd
import pytest
from typer.testing import CliRunner

from edge_agent.broker_settings import BrokerConfig
from edge_agent.data import load_site
from edgefl.commands import app
from edgefl.replay import BrokerError, messages, pick_rows, rebase_shift, replay
from tests.broker import Mosquitto, free_port

NEW_YEAR = pd.Timestamp("2021-01-01 00:00")
ROW = {"temp_air": 21.5, "ghi": float("nan"), "relative_humidity": 0.1}
TENTH = repr(float(np.float32(0.1)))  # 0.10000000149011612: the float32 nearest 0.1, exactly


class Subscriber:
    """A paho client subscribed to ``topic`` before anything is published; collects ``expected`` messages."""

    def __init__(self, port: int, topic: str, expected: int):
        self.expected, self.received = expected, []
        self.subscribed, self.complete = threading.Event(), threading.Event()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda client, *_: client.subscribe(topic, qos=1)
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.subscribed.wait(10), "no SUBACK from the test broker"

    def _on_message(self, _client, _userdata, message: mqtt.MQTTMessage) -> None:
        self.received.append((message.topic, bytes(message.payload)))
        if len(self.received) >= self.expected:
            self.complete.set()

    def wait(self) -> list[tuple[str, bytes]]:
        assert self.complete.wait(20), f"{len(self.received)} of {self.expected} messages arrived"
        return self.received


@contextmanager
def subscribed(port: int, topic: str, expected: int) -> Iterator[Subscriber]:
    subscriber = Subscriber(port, topic, expected)
    try:
        yield subscriber
    finally:
        subscriber.client.disconnect()
        subscriber.client.loop_stop()


def edgefl_replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgefl.cli", "replay", *args], capture_output=True, text=True,
                          timeout=120)


def test_each_style_sends_the_documented_topic_and_payload_without_nan_cells() -> None:
    assert messages("plain", "dev", NEW_YEAR, ROW) == [
        ("sensors/dev/temp_air", b"21.5"), ("sensors/dev/relative_humidity", TENTH.encode())]
    assert messages("plain", "dev", NEW_YEAR, ROW, prefix="home/garden")[0][0] == "home/garden/dev/temp_air"
    assert messages("zigbee2mqtt", "dev", NEW_YEAR, ROW) == [("zigbee2mqtt/dev", (
        '{"temp_air":21.5,"relative_humidity":%s,"last_seen":"2021-01-01T00:00:00.000Z"}' % TENTH).encode())]
    assert messages("tasmota", "dev", NEW_YEAR, ROW, sensor="BME280") == [("tele/dev/SENSOR", (
        '{"Time":"2021-01-01T00:00:00","BME280":{"temp_air":21.5,"relative_humidity":%s}}' % TENTH).encode())]


def test_payload_numbers_parse_back_to_the_same_float32_and_times_are_utc() -> None:
    value = np.float32(0.1)
    (_, payload), = messages("plain", "dev", NEW_YEAR, {"x": value})
    assert np.float32(float(payload)) == value and float(payload) == float(value)
    zoned = pd.Timestamp("2021-01-01 01:00:00.250+01:00")
    (_, body), = messages("zigbee2mqtt", "dev", zoned, {"x": 1.0})
    assert json.loads(body)["last_seen"] == "2021-01-01T00:00:00.250Z"
    for style in ("plain", "zigbee2mqtt", "tasmota"):
        assert messages(style, "dev", NEW_YEAR, {"x": float("nan")}) == []


@pytest.mark.parametrize("last, now", [
    ("2021-12-31 23:00", "2026-11-26 17:42:10+00:00"),
    ("2021-12-31 17:42:10", "2026-11-26 17:42:10+00:00"),
    ("2030-06-01 05:30+02:00", "2026-11-26 03:00+00:00"),
])
def test_rebase_moves_the_last_rows_end_by_whole_days_to_the_latest_past_time_of_that_time_of_day(last: str, now: str) -> None:
    last_row, clock = pd.Timestamp(last), pd.Timestamp(now)
    shift = rebase_shift(last_row, clock)
    moved = last_row + shift
    moved = moved.tz_localize("UTC") if moved.tzinfo is None else moved
    assert shift % pd.Timedelta(days=1) == pd.Timedelta(0)
    assert moved <= clock < moved + pd.Timedelta(days=1)


def test_replay_of_a_station_as_zigbee2mqtt_publishes_its_last_rows(mosquitto) -> None:
    site = load_site("amsterdam")
    with subscribed(mosquitto.port, "zigbee2mqtt/#", 24) as subscriber:
        proc = edgefl_replay("--site", "amsterdam", "--rows", "24", "--style", "zigbee2mqtt", "--speedup", "0",
                             "--port", str(mosquitto.port))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        received = subscriber.wait()
    assert "published 216 readings in 24 messages to 127.0.0.1:" in proc.stdout
    assert len(received) == 24 and {topic for topic, _ in received} == {"zigbee2mqtt/amsterdam"}
    bodies = [json.loads(payload) for _, payload in received]
    for body, values in zip(bodies, site.values[-24:]):
        assert [body[column] for column in site.columns] == [float(v) for v in values]
    seen = pd.DatetimeIndex([body["last_seen"] for body in bodies])
    assert (seen.to_series().diff().dropna() == pd.Timedelta(hours=1)).all()
    end = seen[-1] + pd.Timedelta(hours=1)  # the last row's end is moved to the latest such time of day
    assert end <= pd.Timestamp.now(tz="UTC") < end + pd.Timedelta(days=1)
    assert seen[-1].time() == site.index[-1].time()


def test_replay_of_a_csv_leaves_out_missing_cells(mosquitto, tmp_path: Path) -> None:
    dates = pd.date_range("2024-03-01", periods=6, freq="h").strftime("%Y-%m-%d %H:%M")
    lines = ["date,temp,hum"] + [f"{d},{20 + i / 4},{50 + i}" for i, d in enumerate(dates)]
    csv = tmp_path / "meter.csv"
    csv.write_text("\n".join(lines[:3] + lines[4:]) + "\n")  # 2024-03-01 02:00 is missing
    with subscribed(mosquitto.port, "sensors/#", 5) as subscriber:
        proc = edgefl_replay("--csv", str(csv), "--fill", "skip", "--columns", "temp", "--speedup", "0", "--no-rebase",
                             "--port", str(mosquitto.port))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        received = subscriber.wait()
    assert received == [("sensors/meter/temp", repr(20 + i / 4).encode()) for i in (0, 1, 3, 4, 5)]
    assert "published 5 readings in 5 messages" in proc.stdout


def test_replay_paces_rows_at_the_speedup(mosquitto) -> None:
    rows = pick_rows(load_site("amsterdam"), 3, None)
    sent: list[float] = []
    stats = replay(rows, "tasmota", BrokerConfig(port=mosquitto.port), 36000, "amsterdam",
                   on_message=lambda *_: sent.append(time.monotonic()))
    assert (stats.rows, stats.messages, stats.readings) == (3, 3, 3 * rows.n_features)
    assert stats.seconds >= 0.2 and sent[-1] - sent[0] >= 0.19  # 2 hours of data at 10 h per second


@pytest.mark.parametrize("args, error", [
    (["--site", "atlantis"], "unknown weather site 'atlantis'"),
    (["--csv", "missing.csv"], "missing.csv: file not found"),
    (["--site", "amsterdam", "--style", "homie"], "unknown --style 'homie'"),
    (["--site", "amsterdam", "--speedup", "-1"], "--speedup must be >= 0"),
    (["--site", "amsterdam", "--device", "a/b"], "--device 'a/b' cannot be an MQTT topic level"),
    (["--site", "amsterdam", "--username", "u"], "username and password must be given together"),
])
def test_bad_input_is_refused_in_one_line(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["replay", *args])
    assert result.exit_code == 2 and f"error: {error}" in result.output, result.output


def test_an_unreachable_broker_is_named() -> None:
    port = free_port()
    result = CliRunner().invoke(app, ["replay", "--site", "amsterdam", "--rows", "1", "--port", str(port)])
    assert result.exit_code == 2, result.output
    assert f"error: cannot reach the broker at 127.0.0.1:{port}:" in " ".join(result.output.split())



def test_ctrl_c_stops_after_the_current_row_and_still_delivers_it(mosquitto) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    rows = pick_rows(load_site("miami").select(["temp_air", "ghi"]), 5, None)
    with subscribed(mosquitto.port, "sensors/#", 2) as subscriber:
        stats = replay(rows, "plain", BrokerConfig(port=mosquitto.port), 0, "miami", on_row=interrupt)
        received = subscriber.wait()
    assert stats.interrupted and (stats.rows, stats.messages, stats.readings) == (1, 2, 2)
    assert [topic for topic, _ in received] == ["sensors/miami/temp_air", "sensors/miami/ghi"]


def test_publishes_the_broker_refuses_are_an_error(tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "readonly.conf"
    (tmp_path / "acl").write_text("topic read #\n")
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\nacl_file {tmp_path / 'acl'}\n")
    broker = Mosquitto(tmp_path / "broker", port, config).start()
    try:
        with pytest.raises(BrokerError, match=r"of 2 messages the broker at 127.0.0.1:\d+ refused 2 \(Not authorized\)"):
            replay(pick_rows(load_site("miami").select(["ghi"]), 2, None), "plain", BrokerConfig(port=port), 0, "miami")
    finally:
        broker.stop()
