"""Sensor ingest: payload styles and every refusal kind, the SQLite store (retention, cap,
restarts), resampling with the gap policy, and a real mosquitto (config: test_sensor_config.py)."""

from __future__ import annotations

import json
import time

import numpy as np
import paho.mqtt.client as mqtt
import pandas as pd
import pytest

from edge_agent.data import DataError, GapPolicy
from edge_agent.sensors.ingest import UNKNOWN_TOPIC, SensorIngest
from edge_agent.sensors.payloads import MAX_PAYLOAD_BYTES, BadReading, read
from edge_agent.sensors.settings import SensorSettings

T0 = pd.Timestamp("2021-01-01", tz="UTC")
ROOM = "zigbee2mqtt/room"
ZIGBEE = [{"name": "temperature", "topic": ROOM, "path": "temperature", "time_path": "last_seen"},
          {"name": "humidity", "topic": ROOM, "path": "humidity", "time_path": "last_seen"}]
PLAIN = [{"name": "power", "topic": "meter/power"}, {"name": "temperature", "topic": "room/temperature"}]


def settings(features: list[dict] = ZIGBEE, **fields: object) -> SensorSettings:
    return SensorSettings.model_validate({"step": "1h", "retention_days": 36500, "features": features, **fields})


def zigbee(at: pd.Timestamp, temperature: float, humidity: float = 45.0) -> bytes:
    """A zigbee2mqtt device message with its last_seen option on (ISO 8601)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return json.dumps({"temperature": temperature, "humidity": humidity, "linkquality": 120,
                       "last_seen": stamp}).encode()


@pytest.mark.parametrize("raw, path, time_path, value, stamp", [
    (b" 21.5\n", None, None, 21.5, None),
    (zigbee(T0, 21.5), "temperature", "last_seen", 21.5, T0),
    (b'{"Time": "2021-01-01T00:00:00", "BME280": {"Temperature": 21.5, "Humidity": 45.0}}',
     "BME280.Temperature", "Time", 21.5, T0),
    (b'{"v": "21.5", "t": "2021-01-01T01:00:00+01:00"}', "v", "t", 21.5, T0),
    (b'{"v": 21, "t": 1609459200}', "v", "t", 21.0, T0),
    (b'{"v": -3e2, "t": 1609459200500}', "v", "t", -300.0, T0 + pd.Timedelta("500ms")),
])
def test_each_payload_style_parses(raw, path, time_path, value, stamp) -> None:
    assert read(raw, path, time_path) == (value, None if stamp is None else stamp.value)


HOSTILE = [
    (b"true", None, None, "not_a_number"),
    (b"warm", None, None, "not_a_number"),
    (b"\xff\xfe", None, None, "not_a_number"),
    (b'{"temperature": true}', "temperature", None, "not_a_number"),
    (b'{"temperature": null}', "temperature", None, "not_a_number"),
    (b'{"temperature": "21,5"}', "temperature", None, "not_a_number"),
    (b'{"temperature": {"v": 1}}', "temperature", None, "not_a_number"),
    (b'{"temperature": 21.5', "temperature", None, "not_a_number"),
    (b'{"humidity": 45}', "temperature", None, "missing_field"),
    (b'{"BME280": 21.5}', "BME280.Temperature", None, "missing_field"),
    (b'{"temperature": 21.5}', "temperature", "last_seen", "missing_field"),
    (b"nan", None, None, "not_finite"),
    (b'{"temperature": NaN}', "temperature", None, "not_finite"),
    (b'{"temperature": -Infinity}', "temperature", None, "not_finite"),
    (b'{"temperature": 1e39}', "temperature", None, "not_finite"),
    (b'{"temperature": 1, "t": "now"}', "temperature", "t", "bad_timestamp"),
    (b'{"temperature": 1, "t": "2021-13-01"}', "temperature", "t", "bad_timestamp"),
    (b'{"temperature": 1, "t": true}', "temperature", "t", "bad_timestamp"),
    (b'{"temperature": 1, "t": 1e30}', "temperature", "t", "bad_timestamp"),
    (b"1" * (MAX_PAYLOAD_BYTES + 1), None, None, "too_large"),
    (b'{"temperature": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", "temperature", None, "too_large"),
]


@pytest.mark.parametrize("raw, path, time_path, kind", HOSTILE)
def test_each_hostile_payload_is_refused_with_its_kind(raw, path, time_path, kind) -> None:
    with pytest.raises(BadReading) as refused:
        read(raw, path, time_path)
    assert refused.value.kind == kind


def test_oversize_and_deep_payloads_are_refused_cheaply() -> None:
    started = time.perf_counter()
    for raw in (b"[" * 10_000_000, b'{"a": ' + b"[" * 60_000):
        with pytest.raises(BadReading, match="too_large"):
            read(raw, "a")
    assert time.perf_counter() - started < 0.5


def test_refusals_are_counted_under_their_feature(tmp_path, caplog) -> None:
    ingest = SensorIngest(settings(ZIGBEE + [{"name": "power", "topic": "meter/power"}]), tmp_path)
    for _ in range(2):
        ingest.handle(ROOM, b'{"temperature": "warm", "humidity": 40, "last_seen": 1609459200}', T0)
    ingest.handle(ROOM, b'{"temperature": 20, "humidity": 41, "last_seen": 1609459200}', T0)
    ingest.handle(ROOM, zigbee(T0 + pd.Timedelta("301s"), 20), T0)
    ingest.handle("meter/power", b"1e39", T0)
    ingest.handle("meter/power", b"2", T0, retained=True)
    ingest.handle("zigbee2mqtt/other", b"1", T0)
    ingest.store.close()
    ingest.handle("meter/power", b"3", T0)
    assert ingest.counts() == {
        "temperature": {"not_a_number": 2, "accepted": 1, "in_future": 1},
        "humidity": {"accepted": 1, "out_of_order": 2, "in_future": 1},
        "power": {"not_finite": 1, "retained": 1, "error": 1},
        UNKNOWN_TOPIC: {"unknown_topic": 1},
    }
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 7 and any("temperature" in w and "not_a_number" in w for w in warned)


def test_time_window_out_of_order_future_and_retention(tmp_path) -> None:
    ingest = SensorIngest(settings(retention_days=1), tmp_path)
    arrival = T0 + pd.Timedelta("2D")
    for at, expected in [(T0, "too_old"), (arrival, "accepted"), (arrival, "out_of_order"),
                         (arrival - pd.Timedelta("1s"), "out_of_order"), (arrival + pd.Timedelta("301s"), "in_future"),
                         (arrival + pd.Timedelta("299s"), "accepted")]:
        before = ingest.counts().get("temperature", {}).get(expected, 0)
        ingest.handle(ROOM, zigbee(at, 20.0), arrival)
        assert ingest.counts()["temperature"][expected] == before + 1, (at, expected)
    later = arrival + pd.Timedelta("25h")
    ingest.handle(ROOM, zigbee(later, 21.0), later)
    assert ingest.store.means(["temperature"], 1, (later + pd.Timedelta("1s")).value) == [
        ("temperature", later.value, 21.0)]
    assert ingest.store.latest("temperature") == later.value


def test_the_cap_keeps_the_newest_readings(tmp_path) -> None:
    ingest = SensorIngest(settings(PLAIN[:1], max_readings_per_feature=5), tmp_path)
    for hour in range(8):
        ingest.handle("meter/power", str(hour).encode(), T0 + pd.Timedelta(hours=hour))
    table = ingest.table("meter", now=T0 + pd.Timedelta(hours=8))
    assert list(table.values[:, 0]) == [3, 4, 5, 6, 7] and table.index[0] == pd.Timestamp("2021-01-01 03:00")


def readings_with_gaps(tmp_path) -> SensorIngest:
    """power: hour 0 (two readings, mean 2), 2, 5 and one in the unfinished hour 6; temperature from hour 1."""
    ingest = SensorIngest(settings(PLAIN), tmp_path)
    for minutes, value in [(10, 1.0), (50, 3.0), (130, 5.0), (310, 8.0), (370, 99.0)]:
        ingest.handle("meter/power", str(value).encode(), T0 + pd.Timedelta(minutes=minutes))
    for hour in range(1, 7):
        ingest.handle("room/temperature", f"{20 + hour}".encode(), T0 + pd.Timedelta(hours=hour))
    return ingest


@pytest.mark.parametrize("fill, steps, power", [
    ("skip", 3, [2, None, 5, None, None, 8]),
    ("ffill", 1, [2, 2, 5, None, None, 8]),
    ("ffill", 2, [2, 2, 5, 5, 5, 8]),
    ("interpolate", 2, [2, 3.5, 5, 6, 7, 8]),
])
def test_intervals_are_means_and_gaps_follow_the_policy(tmp_path, fill, steps, power) -> None:
    table = readings_with_gaps(tmp_path).table("room", GapPolicy(fill=fill, max_fill_steps=steps),
                                               now=T0 + pd.Timedelta("6h30min"))
    assert table.columns == ("power", "temperature")
    assert list(table.index) == list(pd.date_range("2021-01-01", periods=6, freq="h"))
    expected = np.array([np.nan if v is None else v for v in power], dtype=np.float32)
    np.testing.assert_array_equal(table.values[:, 0], expected)
    np.testing.assert_array_equal(table.observed[:, 0], ~np.isnan(expected))
    assert not table.observed[0, 1] and list(table.values[1:, 1]) == [21, 22, 23, 24, 25]
    assert [(g.start.hour, g.steps) for g in table.gaps.gaps] == [(0, 2), (3, 2)]


@pytest.mark.parametrize("view", ["table", "rows"])
def test_refuse_policy_names_the_gaps(tmp_path, view) -> None:
    """The table (pandas) and the training agent's row count (numpy alone) refuse alike."""
    read = getattr(readings_with_gaps(tmp_path), view)
    listed = "2 intervals from 2021-01-01 00:00:00, 2 intervals from 2021-01-01 03:00:00"
    with pytest.raises(DataError, match=rf"room: 2 gaps \(intervals of 1:00:00 without a reading\): {listed}; "):
        read("room", now=T0 + pd.Timedelta("6h30min"))
    with pytest.raises(DataError, match="no sensor reading yet"):
        read("room", now=T0)


@pytest.mark.parametrize("fill", ["skip", "ffill"])
def test_the_row_count_is_the_tables(tmp_path, fill) -> None:
    ingest, now = readings_with_gaps(tmp_path), T0 + pd.Timedelta("6h30min")
    policy = GapPolicy(fill=fill, max_fill_steps=1)
    assert ingest.rows("room", policy, now=now) == ingest.table("room", policy, now=now).n_rows == 6


def publish(port: int, messages: list[tuple[str, bytes]]) -> None:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="zigbee2mqtt", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    for topic, payload in messages:
        client.publish(topic, payload, qos=1).wait_for_publish(5)
    client.disconnect()
    client.loop_stop()


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_zigbee2mqtt_readings_through_mosquitto_survive_a_restart(tmp_path, mosquitto) -> None:
    rng = np.random.default_rng(0)
    temperature, humidity = np.round(rng.normal(20, 5, 48), 2), np.round(rng.uniform(30, 70, 48), 1)
    config = settings(broker={"port": mosquitto.port}, store=str(tmp_path / "gw" / "readings.sqlite"))
    ingest = SensorIngest(config, tmp_path / "state", client_id="gw1")
    ingest.start()
    wait_for(lambda: ingest.connected)
    publish(mosquitto.port, [(ROOM, zigbee(T0 + pd.Timedelta(hours=h), temperature[h], humidity[h]))
                             for h in range(48)])
    wait_for(lambda: ingest.counts().get("humidity", {}).get("accepted") == 48)
    now = T0 + pd.Timedelta("48h")
    first = ingest.table("room", now=now)
    ingest.stop()
    assert (tmp_path / "gw" / "readings.sqlite").is_file()
    assert list(first.index) == list(pd.date_range("2021-01-01", periods=48, freq="h"))
    np.testing.assert_array_equal(first.values, np.stack([temperature, humidity], axis=1).astype(np.float32))
    restarted = SensorIngest(config, tmp_path / "state", client_id="gw1")
    again = restarted.table("room", now=now)
    np.testing.assert_array_equal(again.values, first.values)
    assert list(again.index) == list(first.index)
    restarted.handle(ROOM, zigbee(T0, 1.0), now)
    assert restarted.counts()["temperature"] == {"out_of_order": 1}
    publish(mosquitto.port, [(ROOM, zigbee(now, 30.0))])  # while the agent is down: kept by its session
    restarted.start()
    wait_for(lambda: restarted.counts()["temperature"].get("accepted") == 1)
    restarted.stop()
