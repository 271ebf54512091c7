"""Home Assistant MQTT discovery for a gateway's forecasts: one sensor per feature whose state is
the next step's forecast and whose attributes are the whole forecast (times, values, intervals),
so each forecast appears in Home Assistant without any YAML."""

from __future__ import annotations

import json

from edge_agent.serving.onnx_serving import BundleInfo


def discovery_messages(info: BundleInfo, state_topic: str, prefix: str) -> list[tuple[str, bytes]]:
    """(topic, retained config payload) per feature under ``<prefix>/sensor/<object id>/config``."""
    device = {"identifiers": [f"edgefl_{info.client_id}"], "name": f"edgefl {info.client_id}", "manufacturer": "edgefl"}
    messages = []
    for column in info.columns:
        object_id = f"edgefl_{info.client_id}_{column}_forecast".replace(".", "_").replace("-", "_")
        selected = f"value_json.forecast[{json.dumps(column)}]"
        config = {
            "name": f"{column} forecast", "unique_id": object_id, "object_id": object_id, "state_topic": state_topic,
            "value_template": f"{{{{ {selected}.value[0] }}}}",
            "json_attributes_topic": state_topic,
            "json_attributes_template": f"{{{{ dict(times=value_json.times, **{selected}) | tojson }}}}",
            "device": device,
        }
        messages.append((f"{prefix}/sensor/{object_id}/config", json.dumps(config).encode()))
    return messages
