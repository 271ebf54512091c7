"""The gateway's own sensors: readings from its local MQTT broker (``ingest``), validated
(``payloads``), kept in a bounded SQLite store (``store``) and resampled into the model's table.
Nothing is imported here, so the configs read ``settings`` without loading paho."""
