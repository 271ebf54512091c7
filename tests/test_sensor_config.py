"""The [sensors] table of agent.toml and data.source = "sensors": errors that name the field."""

from __future__ import annotations

import re

import pytest

from edge_agent.config import AgentConfig, ConfigError, DataSource, load_config
from edge_agent.data import DataError

AGENT = 'fleet = "f"\nclient_id = "gw1"\nstate_dir = "state"\n'
SENSORS = '[sensors]\nstep = "1h"\n[[sensors.features]]\nname = "t"\ntopic = "room/t"\n'


@pytest.mark.parametrize("text, message", [
    ('[data]\nsource = "sensors"\n', "sensors: required when data.source = 'sensors'"),
    ('[data]\nsite = "amsterdam"\n' + SENSORS, "sensors: given, but data.source is not 'sensors'"),
    ('[data]\nsource = "sensors"\ncolumns = ["t"]\n' + SENSORS, "columns: not used with source = 'sensors'"),
    ('[data]\nsource = "sensors"\nsite = "amsterdam"\n' + SENSORS, "exactly one of csv or site, or source"),
    ('[data]\nsource = "sensors"\n' + SENSORS.replace("room/t", "room/#"), "sensors.features[0].topic"),
    ('[data]\nsource = "sensors"\n' + SENSORS.replace("1h", "1M"), "sensors.step"),
    ('[data]\nsource = "sensors"\n' + SENSORS.replace('"1h"', '"1h"\nretention_days = 0'),
     "sensors.retention_days"),
    ('[data]\nsource = "sensors"\n' + SENSORS + SENSORS.split("\n", 2)[2], "features: names must be unique"),
    ('[data]\nsource = "sensors"\n' + SENSORS + 'time_path = "Time"\n', "time_path: needs path"),
    ('[data]\nsource = "sensors"\n' + SENSORS + 'units = "C"\n', "sensors.features[0].units"),
])
def test_config_errors_name_the_field(tmp_path, text, message) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(AGENT + text)
    with pytest.raises(ConfigError, match=re.escape(message).replace("'", ".")):
        load_config(path, AgentConfig)


def test_a_sensor_config_loads_and_its_table_comes_from_the_store(tmp_path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(AGENT + '[data]\nsource = "sensors"\ngaps = {fill = "ffill"}\n' + SENSORS)
    config = load_config(path, AgentConfig)
    assert config.sensors.features[0].topic == "room/t" and config.sensors.store_path(config.state_dir).name == \
        "readings.sqlite"
    with pytest.raises(DataError, match="SensorIngest.table"):
        config.data.load()
    assert DataSource(site="amsterdam").source is None
