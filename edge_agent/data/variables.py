"""The canonical weather variables (the bundled stations' columns and the foundation model's
inputs) and the extra series' quantities, apart from their loaders so that a model's settings
name them without pandas or pvlib."""

from __future__ import annotations

WEATHER_VARIABLES: tuple[str, ...] = (
    "ghi", "dni", "dhi", "temp_air", "temp_dew", "relative_humidity", "pressure", "wind_speed", "wind_direction",
)
EXTRA_VARIABLES: tuple[str, ...] = ("precipitation", "pm2_5", "pm10")
"""Quantities of ``edge_agent.data.extra`` that no weather station has: a foundation layout
includes them to take those series."""
