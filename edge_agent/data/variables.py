"""The canonical weather variables (the bundled stations' columns and the foundation model's
inputs), apart from their loader so that a model's settings name them without pandas or pvlib."""

from __future__ import annotations

WEATHER_VARIABLES: tuple[str, ...] = (
    "ghi", "dni", "dhi", "temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed", "wind_direction",
)
