"""The gateway's own sensors: readings from its local MQTT broker, validated, kept in a bounded
SQLite store and resampled into the model's table."""

from edge_agent.sensors.ingest import UNKNOWN_TOPIC, SensorIngest
from edge_agent.sensors.payloads import MAX_PAYLOAD_BYTES, BadReading, read
from edge_agent.sensors.settings import SensorFeature, SensorSettings
from edge_agent.sensors.store import ReadingStore

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "UNKNOWN_TOPIC",
    "BadReading",
    "ReadingStore",
    "SensorFeature",
    "SensorIngest",
    "SensorSettings",
    "read",
]
