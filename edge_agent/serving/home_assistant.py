"""Home Assistant MQTT discovery for a gateway's forecasts (keys as documented for the MQTT sensor,
https://www.home-assistant.io/integrations/sensor.mqtt/): per feature, one sensor for each chosen
step ahead (``[serving] home_assistant_steps``, e.g. +1 h and +24 h) whose state is that step's
forecast, with the measured sensor's ``unit_of_measurement`` and ``device_class`` and
``state_class: measurement``, so Home Assistant records its history and draws it in the same graph
as the sensor it forecasts. The first step's sensor also carries the whole forecast (times, values,
intervals) as attributes. A sensor is available while both the publishing client is (its Last
Will: retained ``online``/``offline`` on its status topic) and its readings are current (retained
``fresh``/``stale`` on the freshness topic, ``edge_agent.serving.freshness``), and expires when no
forecast came for three ``every_s``."""

from __future__ import annotations

import json
import math

from edge_agent.sensors.settings import SensorFeature
from edge_agent.serving.freshness import FRESH, STALE
from edge_agent.serving.onnx_serving import BundleInfo
from edge_agent.times import NS_PER_S

KNOWN_QUANTITIES = {  # the bundled weather variables (pvlib's names): unit, Home Assistant device class
    "temp_air": ("°C", "temperature"), "temp_dew": ("°C", "temperature"), "relative_humidity": ("%", "humidity"),
    "wind_speed": ("m/s", "wind_speed"), "pressure": ("mbar", "atmospheric_pressure"),
    "ghi": ("W/m²", "irradiance"), "dni": ("W/m²", "irradiance"), "dhi": ("W/m²", "irradiance"),
    "wind_direction": ("°", None),
}
AVAILABLE, NOT_AVAILABLE = "online", "offline"  # edge_agent.mqtt.Connection's presence and Last Will


def quantity(feature: SensorFeature | None, column: str) -> dict[str, str]:
    """``unit_of_measurement`` and ``device_class`` of a feature: configured, else known by name."""
    unit, device_class = KNOWN_QUANTITIES.get(column, (None, None))
    if feature is not None:
        unit, device_class = feature.unit or unit, feature.device_class or device_class
    return {key: value for key, value in (("unit_of_measurement", unit), ("device_class", device_class)) if value}


def ahead(steps: int, step_ns: int) -> str:
    """How far ahead ``steps`` steps are, for names and ids: '1h', '24h', '15min', '1d'."""
    seconds = steps * step_ns // NS_PER_S
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds % size == 0 and seconds >= size and (unit != "d" or seconds > 86_400 * 2):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def availability(status_topic: str, freshness_topic: str) -> dict:
    """Available while the client is online and its readings are fresh (both must say so)."""
    return {"availability": [
        {"topic": status_topic, "payload_available": AVAILABLE, "payload_not_available": NOT_AVAILABLE},
        {"topic": freshness_topic, "value_template": "{{ value_json.state }}", "payload_available": FRESH,
         "payload_not_available": STALE}], "availability_mode": "all"}


def discovery_messages(info: BundleInfo, state_topic: str, prefix: str, features: list[SensorFeature],
                       availability_topics: tuple[str, str], steps: tuple[int, ...],
                       every_s: float) -> list[tuple[str, bytes]]:
    """(topic, retained config payload) per feature and step ahead under ``<prefix>/sensor/<object id>/config``;
    ``availability_topics``: the client's status topic and its freshness topic."""
    device = {"identifiers": [f"edgefl_{info.client_id}"], "name": f"edgefl {info.client_id}", "manufacturer": "edgefl"}
    by_name = {feature.name: feature for feature in features}
    shown = [step for step in steps if step <= info.horizon]
    messages = []
    for column in info.columns:
        selected = f"value_json.forecast[{json.dumps(column)}]"
        for step in shown:
            lead = ahead(step, info.step_ns)
            object_id = f"edgefl_{info.client_id}_{column}_forecast_{lead}".replace(".", "_").replace("-", "_")
            config = {
                "name": f"{column} forecast +{lead}", "unique_id": object_id, "object_id": object_id,
                "state_topic": state_topic, "value_template": f"{{{{ {selected}.value[{step - 1}] }}}}",
                **quantity(by_name.get(column), column), "state_class": "measurement",
                **availability(*availability_topics), "expire_after": math.ceil(3 * every_s), "device": device,
            }
            if step == shown[0]:
                config |= {"json_attributes_topic": state_topic,
                           "json_attributes_template": f"{{{{ dict(times=value_json.times, **{selected}) | tojson }}}}"}
            messages.append((f"{prefix}/sensor/{object_id}/config", json.dumps(config).encode()))
    return messages
