"""The ``[sensors]`` table of ``agent.toml``: the gateway's local broker, which topic (and JSON
field) carries each model feature, the model's step and how much history the store keeps::

    [data]
    source = "sensors"
    gaps = { fill = "interpolate", max_fill_steps = 2 }

    [sensors]
    step = "1h"
    broker = { host = "127.0.0.1", port = 1883 }

    [[sensors.features]]
    name = "temperature"
    topic = "zigbee2mqtt/living_room"
    path = "temperature"
    time_path = "last_seen"

    [[sensors.features]]
    name = "power"
    topic = "tele/meter/SENSOR"
    path = "ENERGY.Power"
    time_path = "Time"
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from edge_agent.broker_settings import BrokerConfig
from edge_agent.times import NS_PER_S, parse_duration

_WILDCARDS = ("+", "#")


def _check_dot_path(path: str | None) -> str | None:
    """A dot-separated JSON path needs a name between every pair of dots."""
    if path is not None and not all(path.split(".")):
        raise ValueError(f"{path!r} has an empty part; write names separated by single dots, e.g. 'BME280.Temperature'")
    return path


class SensorFeature(BaseModel):
    """One model feature: the exact MQTT topic it arrives on and where its value (and, optionally,
    its timestamp) sits in the payload. Several features may share a topic."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="the model feature (table column) this reading feeds")
    topic: str = Field(min_length=1, description="an exact MQTT topic (no + or # wildcards)")
    path: str | None = Field(None, description="dot path to the value in a JSON payload; absent: a plain number")
    time_path: str | None = Field(
        None, description="dot path to the reading's timestamp in the JSON payload; absent: the arrival time")
    unit: str | None = Field(None, min_length=1, max_length=16, description="the readings' unit as Home Assistant "
                             "shows it (e.g. '°C'); default: known for the bundled weather names")
    device_class: str | None = Field(None, pattern=r"^[a-z_]{1,32}$", description="Home Assistant's sensor device "
                                     "class (e.g. 'temperature'); default: known for the bundled weather names")

    @field_validator("topic")
    @classmethod
    def _exact_topic(cls, topic: str) -> str:
        if any(w in topic for w in _WILDCARDS):
            raise ValueError(f"{topic!r} has an MQTT wildcard (+ or #); give each feature's exact topic")
        return topic

    @field_validator("path", "time_path")
    @classmethod
    def _dot_path(cls, path: str | None) -> str | None:
        return _check_dot_path(path)

    @model_validator(mode="after")
    def _time_needs_json(self) -> "SensorFeature":
        if self.time_path is not None and self.path is None:
            raise ValueError("time_path: needs path (a plain-number payload carries no timestamp)")
        return self


class SensorSettings(BaseModel):
    """Where the readings come from and how long the gateway keeps them."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    broker: BrokerConfig = Field(BrokerConfig(), strict=False, description="the gateway's local (sensor) broker")
    step: str = Field(description="the model's step as a duration, e.g. '1h', '15min' or '1h30min'")
    retention_days: float = Field(30.0, gt=0, strict=False, description="readings older than this are deleted")
    max_readings_per_feature: int = Field(500_000, ge=1, description="hard cap per feature; the oldest are pruned")
    max_future_s: float = Field(
        300.0, ge=0, strict=False, description="refuse readings stamped more than this ahead of their arrival")
    store: Path | None = Field(None, strict=False, description="SQLite file; absent: <state_dir>/readings.sqlite")
    features: list[SensorFeature] = Field(min_length=1)

    @field_validator("step")
    @classmethod
    def _positive_step(cls, step: str) -> str:
        try:
            delta = parse_duration(step)
        except ValueError as err:
            raise ValueError(f"{step!r} is not a fixed duration such as '1h' or '15min' ({err})") from None
        if delta < NS_PER_S:
            raise ValueError(f"{step!r} must be at least one second")
        return step

    @model_validator(mode="after")
    def _unique_names(self) -> "SensorSettings":
        names = [f.name for f in self.features]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"features: names must be unique; repeated: {repeated}")
        return self

    @property
    def step_ns(self) -> int:
        """The step in nanoseconds."""
        return parse_duration(self.step)

    @property
    def retention_ns(self) -> int:
        """How far back readings are kept, in nanoseconds."""
        return round(timedelta(days=self.retention_days) / timedelta(microseconds=1)) * 1_000

    def store_path(self, state_dir: Path) -> Path:
        """The SQLite file: ``store`` if given, else ``readings.sqlite`` in the agent's state directory."""
        return self.store if self.store is not None else Path(state_dir) / "readings.sqlite"


class ServingSettings(BaseModel):
    """``[serving]``: where a live gateway publishes its forecasts (on its local broker) and how often."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str | None = Field(None, description="forecast topic; default edgefl/<client_id>/forecast")
    every_s: float = Field(300.0, ge=1.0, description="seconds between forecasts (and one after every accepted round)")
    retain: bool = Field(True, description="the broker keeps the latest forecast for new subscribers")
    home_assistant: bool = Field(False, description="announce each feature's forecast as a Home Assistant sensor "
                                 "(MQTT discovery)")
    discovery_prefix: str = Field("homeassistant", pattern=r"^[A-Za-z0-9_-]+$", description="Home Assistant's "
                                  "discovery prefix")
    home_assistant_steps: tuple[int, ...] = Field((1, 24), min_length=1, max_length=8, description="one Home "
                                                  "Assistant sensor per feature for each of these steps ahead (those "
                                                  "beyond the model's horizon are left out)")
    stale_after: str | None = Field(None, description="no forecast is published as current while a feature's newest "
                                    "reading is older than this duration (e.g. '3h'); a stale state is published "
                                    "instead; default: three [sensors] steps (the expected reading plus two)")

    @field_validator("stale_after")
    @classmethod
    def _duration(cls, age: str | None) -> str | None:
        if age is not None:
            try:
                positive = parse_duration(age) > 0
            except ValueError as err:
                raise ValueError(f"{age!r} is not a fixed duration such as '3h' or '45min' ({err})") from None
            if not positive:
                raise ValueError(f"{age!r} must be longer than zero")
        return age

    def stale_after_ns(self, step_ns: int) -> int:
        """How old the newest reading may be before forecasts stop: ``stale_after`` or three steps."""
        return parse_duration(self.stale_after) if self.stale_after else 3 * step_ns

    def freshness_topic(self, client_id: str) -> str:
        """Where the gateway says whether its forecasts are current (retained ``fresh``/``stale`` JSON)."""
        return f"{self.forecast_topic(client_id)}/freshness"

    @field_validator("home_assistant_steps")
    @classmethod
    def _steps_ahead(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if any(step < 1 for step in steps) or len(set(steps)) != len(steps):
            raise ValueError(f"{list(steps)}: steps ahead are distinct whole numbers >= 1")
        return steps

    @field_validator("topic")
    @classmethod
    def _exact_topic(cls, topic: str | None) -> str | None:
        if topic is not None and (not topic or any(w in topic for w in _WILDCARDS)):
            raise ValueError(f"{topic!r}: a forecast topic is a plain topic (no + or # wildcards)")
        return topic

    def forecast_topic(self, client_id: str) -> str:
        return self.topic or f"edgefl/{client_id}/forecast"
