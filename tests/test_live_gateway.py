"""A live gateway over a real mosquitto: ``edgefl replay`` publishes a bundled station in
zigbee2mqtt style, the agent stores the readings, a restarted agent (with one feature dropped
from its config) still has them, hostile readings of every kind are counted and reported in the
update metrics, the agent trains the rounds the coordinator announces on the stored history, and
publishes forecasts equal to the offline ones (with their Home Assistant discovery configs)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pandas as pd

from coordinator.store import Store
from edge_agent.config import AgentConfig, dump_toml, load_config
from edge_agent.data import load_site
from edge_agent.forecast import forecast
from edge_agent.learners import make_learner
from edge_agent.live import gateway_table
from export.bundle import write_bundle
from edge_agent.serving.onnx_serving import OnnxServing
from tests.fleet import MODEL, SEED, TRAINING, coordinator_config, exit_code, start, wait_for

FEATURES = ("temp_air", "relative_humidity", "wind_speed")
ROWS = 200  # > 120, the history one window of MODEL needs; 8 days, inside the 30-day retention
STATION, BAROMETER, FORECASTS = "zigbee2mqtt/amsterdam", "zigbee2mqtt/barometer", "home/amsterdam/forecast"
REPLAY_AGE = "2d"  # a replayed station's last row ends up to a day ago (edgefl replay's whole-day rebase)
KINDS = ("not_a_number", "missing_field", "not_finite", "bad_timestamp", "too_old", "in_future", "out_of_order",
         "unknown_topic")
TRAINING_AGENT_WITHOUT = ("torch", "statsforecast", "pandas")  # what the long-lived `agent run` process never imports


def live_config(folder: Path, port: int, barometer: bool) -> Path:
    """A head-mode agent whose data are its sensors on the test broker (also its fleet broker)."""
    features = [{"name": f, "topic": STATION, "path": f, "time_path": "last_seen"} for f in FEATURES]
    if barometer:
        features.append({"name": "pressure", "topic": BAROMETER, "path": "pressure", "time_path": "last_seen"})
    data = {"fleet": "test", "client_id": "client00", "state_dir": str(folder / "agent0"), "seed": SEED,
            "client_index": 0, "data": {"source": "sensors", "gaps": {"fill": "ffill", "max_fill_steps": 2}},
            "model": MODEL, "training": TRAINING, "broker": {"port": port, "keepalive_s": 5},
            "sensors": {"step": "1h", "broker": {"port": port}, "features": features},
            **({} if barometer else {"serving": {"topic": FORECASTS, "every_s": 3600, "home_assistant": True,
                                                 "stale_after": REPLAY_AGE}})}
    path = folder / f"agent{'-barometer' if barometer else ''}.toml"
    path.write_text(dump_toml(data))
    return path


class Watch:
    """The payloads published on ``topic`` (retained ones too), as they arrive."""

    def __init__(self, port: int, topic: str = "edgefl/client00-sensors/status"):
        self.seen: list[bytes] = []
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda client, *_: client.subscribe(topic, qos=1)
        self.client.on_message = lambda _c, _u, message: self.seen.append(bytes(message.payload))
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def publish(port: int, messages: list[tuple[str, bytes]]) -> None:
    """QoS 1 publishes, each acknowledged by the broker."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic, payload in messages:
            client.publish(topic, payload, qos=1).wait_for_publish(30)
    finally:
        client.disconnect()
        client.loop_stop()


def replay(port: int, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "edgefl.cli", "replay", "--site", "amsterdam", "--rows", str(ROWS),
                           "--style", "zigbee2mqtt", "--speedup", "0", "--port", str(port), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def stored(db: Path, feature: str) -> int:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT COUNT(*) FROM readings WHERE feature = ?", (feature,)).fetchone()[0]


def hostile(last_seen: pd.Timestamp) -> list[tuple[str, bytes]]:
    """One message per bad kind (after the replayed rows, so only out_of_order is about order)."""
    later = (last_seen + pd.Timedelta(minutes=30)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    future = (pd.Timestamp.now("UTC") + pd.Timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    bodies = [{"temp_air": "warm", "last_seen": later}, {"temp_air": 1.0, "last_seen": "yesterday"},
              {"temp_air": 1.0, "last_seen": "2000-01-01T00:00:00.000Z"}, {"temp_air": 1.0, "last_seen": future},
              {"temp_air": 1.0, "relative_humidity": 50.0, "wind_speed": 1.0,
               "last_seen": (last_seen - pd.Timedelta(hours=5)).strftime("%Y-%m-%dT%H:%M:%S.000Z")}]
    return ([(STATION, json.dumps(body).encode()) for body in bodies]
            + [(STATION, b'{"temp_air": NaN, "last_seen": "' + later.encode() + b'"}'),
               (BAROMETER, b'{"pressure": 1000.0}')])


def test_a_live_gateway_stores_replayed_readings_keeps_them_across_a_restart_and_trains_on_them(
    tmp_path: Path, mosquitto
) -> None:
    """The long-lived agent process never loads torch, statsforecast or pandas (``TRAINING_AGENT_WITHOUT``;
    each agent says at its exit which it had loaded), as a small gateway's must: it learns its
    model's facts, trains and exports the bundle it serves in child processes, through a restart,
    two trained rounds and two accepted global models."""
    port, watch = mosquitto.port, Watch(mosquitto.port)
    try:
        first = start(tmp_path, "agent-first", "agent", "run", "-c", str(live_config(tmp_path, port, True)),
                      reported=TRAINING_AGENT_WITHOUT)
        wait_for(lambda: b"online" in watch.seen, 180, "the first agent's sensor client")
        replay(port, "--columns", ",".join(FEATURES))
        replay(port, "--columns", "pressure", "--device", "barometer")
        db = tmp_path / "agent0" / "readings.sqlite"
        wait_for(lambda: all(stored(db, f) == ROWS for f in (*FEATURES, "pressure")), 120, "every reading stored")
        first.send_signal(signal.SIGTERM)
        first.wait(60)
        watch.seen.clear()
        second = start(tmp_path, "agent", "agent", "run", "-c", str(live_config(tmp_path, port, False)),
                       reported=TRAINING_AGENT_WITHOUT)
        wait_for(lambda: b"online" in watch.seen, 180, "the restarted agent's sensor client")
    finally:
        watch.close()
    cfg = load_config(live_config(tmp_path, port, False), AgentConfig)
    table = gateway_table(cfg)
    publish(port, hostile(pd.Timestamp(table.index[-1]).tz_localize("UTC")))
    log = tmp_path / "agent.log"
    wait_for(lambda: all(f"({kind}" in log.read_text() for kind in KINDS), 60, "every bad kind logged")
    coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c",
                        str(coordinator_config(tmp_path, port, 2, start_clients=1)))
    assert exit_code(coordinator) == 0, (tmp_path / "coordinator.log").read_text()
    wait_for(lambda: "serving forecasts and waiting for the next campaign" in log.read_text(), 60,
             "the gateway going on after the campaign")
    assert second.poll() is None  # a live gateway serves on after the campaign ends, and joins the next
    second.send_signal(signal.SIGTERM)
    assert second.wait(60) == 0
    assert [(tmp_path / f"{name}.modules").read_text() for name in ("agent-first", "agent")] == ["", ""]

    site = load_site("amsterdam").select(list(FEATURES))
    assert table.columns == FEATURES and table.n_rows == ROWS and table.observed.all()
    np.testing.assert_array_equal(table.values, site.values[-ROWS:])
    assert (table.index.time == site.index[-ROWS:].time).all()
    store = Store(tmp_path / "coordinator")
    try:
        assert [sorted(u.client_id for u in store.updates(r)) for r in (1, 2)] == [["client00"]] * 2
        metrics = store.updates(2)[0].metrics
    finally:
        store.close()
    assert all(metrics[f"sensor_{kind}"] >= 1 for kind in KINDS), metrics
    assert "Traceback" not in log.read_text()
    published = latest_forecast(port)
    offline = forecast(cfg)
    assert published["round"] == 2 and published["model"] == "federated" and published["times"][0].endswith("Z")
    assert published["window_end"] == pd.Timestamp(table.index[-1]).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert published["times"] == [pd.Timestamp(t).strftime("%Y-%m-%dT%H:%M:%SZ") for t in offline.stamps]
    values = np.array([published["forecast"][column]["value"] for column in FEATURES]).T
    np.testing.assert_allclose(values, offline.values.numpy(), rtol=1e-5, atol=1e-5)
    discovery = retained(port, "homeassistant/sensor/+/config", len(FEATURES))  # +24 h is beyond a 12 h horizon
    assert sorted(config["unique_id"] for config in discovery) == [
        f"edgefl_client00_{feature}_forecast_1h" for feature in sorted(FEATURES)]
    assert all(config["state_topic"] == FORECASTS and "value_json.forecast" in config["value_template"]
               for config in discovery)


def retained(port: int, topic: str, count: int = 1) -> list[dict]:
    """The JSON documents the broker retained on ``topic`` (a filter)."""
    watch = Watch(port, topic)
    try:
        wait_for(lambda: len(watch.seen) >= count, 30, f"{count} retained messages on {topic}")
        return [json.loads(payload) for payload in watch.seen]
    finally:
        watch.close()


def latest_forecast(port: int) -> dict:
    """The forecast the broker retained on the gateway's forecast topic."""
    return retained(port, FORECASTS)[-1]


def test_the_serving_only_process_publishes_forecasts_of_each_new_bundle_without_torch(
    tmp_path: Path, mosquitto
) -> None:
    """``edgefl agent serve`` ingests the replayed station, publishes the forecast of the first
    bundle the (here in-process) training side writes, then of the next one, without torch and pandas
    installed (as with ``pip install 'edgefl[serve]'``: importing either fails in that process) and
    without loading rich or typer, which it does not need either (2 MB and 2.7 MB resident;
    bench/gateway.py, edgefl.cli)."""
    port, config = mosquitto.port, live_config(tmp_path, mosquitto.port, False)
    watch = Watch(port, "edgefl/client00-serve-sensors/status")
    try:
        server = start(tmp_path, "serve", "agent", "serve", "-c", str(config), missing=("torch", "pandas", "rich", "typer"))
        wait_for(lambda: b"online" in watch.seen, 180, "the serving process's sensor client")
    finally:
        watch.close()
    replay(port, "--columns", ",".join(FEATURES))
    wait_for(lambda: stored(tmp_path / "agent0" / "readings.sqlite", "temp_air") == ROWS, 120, "every reading stored")
    cfg = load_config(config, AgentConfig)
    table, folder = gateway_table(cfg), tmp_path / "agent0" / "serving"
    learner = make_learner(cfg, table)
    watch = Watch(port, FORECASTS)
    try:
        for round_index in (1, 2):
            write_bundle(learner, cfg.client_id, round_index, cfg.sensors.step_ns, folder)
            wait_for(lambda: any(json.loads(p)["round"] == round_index - 1 for p in watch.seen), 60,
                     f"the forecast of bundle {round_index}")
    finally:
        watch.close()
    server.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0
    log = (tmp_path / "serve.log").read_text()
    assert "client00: waiting for a model bundle: none in " in log and " serving forecasts on " not in log
    loaded = [line for line in log.splitlines() if "(loaded: " in line]
    assert len(loaded) == 2 and all(line.endswith("(loaded: onnxruntime)") for line in loaded), log
    assert "Traceback" not in log
    published, lookback = json.loads(watch.seen[-1]), MODEL["lookback"]
    offline = OnnxServing(folder).forecast(table.index[-lookback:].as_unit("ns").asi8, table.values[-lookback:])
    assert published["window_end"] == offline["window_end"] and published["forecast"] == offline["forecast"]

