"""A live gateway trains in a child process: over a real mosquitto, forecasts keep coming every
second while a (deliberately long) round trains, the round's update still arrives, and the Home
Assistant discovery configs carry the documented keys (unit, device class, state class, the
agent's Last Will as availability) with templates that render numbers from the published forecast."""

from __future__ import annotations

import json
import signal
import threading
import time
import tomllib
from pathlib import Path

import jinja2
import paho.mqtt.client as mqtt

from edge_agent.config import dump_toml
from edge_agent.serving.home_assistant import KNOWN_QUANTITIES
from tests.fleet import coordinator_config, exit_code, start, wait_for
from tests.test_live_gateway import FEATURES, FORECASTS, live_config, replay

UPDATE, DISCOVERY, AVAILABILITY = "edgefl/test/agents/client00/update", "homeassistant/sensor/+/config", \
    "edgefl/client00-sensors/status"
FRESHNESS = f"{FORECASTS}/freshness"
LONG_ROUND = {"min_steps": 3000, "max_steps": 0}  # a round of 4-20 s on the test model (1-5 ms a step, no cap)
HA_KEYS = {"name", "unique_id", "state_topic", "value_template", "unit_of_measurement", "device_class",
           "state_class", "availability", "availability_mode", "expire_after", "device"}


class Arrivals:
    """Every message on the watched topics (retained ones too), with its arrival time."""

    def __init__(self, port: int, topics: list[str]):
        self.seen: list[tuple[float, str, bytes]] = []
        self.lock = threading.Lock()
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda client, *_: client.subscribe([(t, 1) for t in topics])
        self.client.on_message = self._arrived
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _arrived(self, _client, _userdata, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.seen.append((time.time(), message.topic, bytes(message.payload)))

    def on(self, topic_filter: str) -> list[tuple[float, bytes]]:
        with self.lock:
            return [(at, payload) for at, topic, payload in self.seen if mqtt.topic_matches_sub(topic_filter, topic)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def serving_every_second(folder: Path, port: int) -> Path:
    """The live gateway of test_live_gateway, forecasting every second, with a long round."""
    path = live_config(folder, port, False)
    data = tomllib.loads(path.read_text())
    data["serving"]["every_s"] = 1.0
    data["training"] |= LONG_ROUND
    path.write_text(dump_toml(data))
    return path


def test_forecasts_keep_coming_while_the_agent_trains_and_home_assistant_can_draw_them(tmp_path: Path,
                                                                                        mosquitto) -> None:
    port = mosquitto.port
    watch = Arrivals(port, [FORECASTS, UPDATE, DISCOVERY, AVAILABILITY, FRESHNESS])
    try:
        agent = start(tmp_path, "agent", "agent", "run", "-c", str(serving_every_second(tmp_path, port)))
        wait_for(lambda: any(p == b"online" for _, p in watch.on(AVAILABILITY)), 180, "the agent's sensor client")
        replay(port, "--columns", ",".join(FEATURES))
        coordinator = start(tmp_path, "coordinator", "coordinator", "serve", "-c", str(coordinator_config(
            tmp_path, port, 1, start_clients=1, round_timeout_s=600.0)))
        wait_for(lambda: watch.on(UPDATE), 300, "the round's update")
        assert exit_code(coordinator) == 0, (tmp_path / "coordinator.log").read_text()
        updated = watch.on(UPDATE)[0][0]
        wait_for(lambda: len(watch.on(DISCOVERY)) >= len(FEATURES), 30, "the discovery configs")
        forecasts = watch.on(FORECASTS)
        freshness = json.loads(watch.on(FRESHNESS)[-1][1])
        discovery = [json.loads(payload) for _, payload in watch.on(DISCOVERY)]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(60) == 0
        wait_for(lambda: watch.on(AVAILABILITY)[-1][1] == b"offline", 30, "the agent's sensor client offline")
    finally:
        watch.close()
    log = (tmp_path / "agent.log").read_text()
    assert "round 1: training in child process" in log and "Traceback" not in log

    began = forecasts[0][0]  # the first forecast comes from the accepted global model, just before training
    during = [at for at, _ in forecasts if began <= at <= updated]
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert updated - began >= 3.0, f"the round took {updated - began:.1f} s: too short to show anything"
    assert len(during) >= (updated - began) / 2 and max(gaps) < 3.0, (updated - began, gaps)

    latest = json.loads(forecasts[-1][1])
    assert {config["unique_id"] for config in discovery} == {f"edgefl_client00_{f}_forecast_1h" for f in FEATURES}
    for config in discovery:
        column = config["name"].removesuffix(" forecast +1h")
        assert HA_KEYS <= config.keys() and config["state_topic"] == FORECASTS, config
        unit, device_class = KNOWN_QUANTITIES[column]
        assert (config["unit_of_measurement"], config["device_class"], config["state_class"]) == (
            unit, device_class, "measurement")
        status, fresh = config["availability"]
        assert (status["topic"], status["payload_available"], status["payload_not_available"]) == (
            AVAILABILITY, "online", "offline") and config["availability_mode"] == "all"
        assert jinja2.Template(fresh["value_template"]).render(value_json=freshness) == fresh["payload_available"]
        state = jinja2.Template(config["value_template"]).render(value_json=latest)
        assert float(state) == latest["forecast"][column]["value"][0]
        attributes = json.loads(jinja2.Template(config["json_attributes_template"]).render(value_json=latest))
        assert attributes["times"] == latest["times"] and len(attributes["value"]) == len(latest["times"])
