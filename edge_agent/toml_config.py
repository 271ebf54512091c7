"""The TOML plumbing of every service config (pydantic models, errors that name the file and
field, writing configs back with tomli-w), ``[data]``, and the tables of ``agent.toml`` that a
live gateway's sensor side reads (``LiveGatewayConfig``). Nothing here imports torch: the
serving-only process (``edgefl agent serve``) reads its config with this module alone, while the
model settings stay in ``edge_agent.config``."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from edge_agent.data import DataError, GapPolicy
from edge_agent.limits import NAME_PATTERN
from edge_agent.problems import dotted, problem_lines
from edge_agent.sensors.settings import SensorSettings, ServingSettings

if TYPE_CHECKING:
    from edge_agent.data import SeriesTable

Config = TypeVar("Config", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that cannot be used; the message has one line per problem, each naming the
    file and the key."""


class DataSource(BaseModel):
    """Local data: a CSV file (date column + numeric columns), one bundled weather site, or the
    gateway's own sensors (``source = "sensors"``, configured in ``[sensors]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    csv: Path | None = Field(None, description="a CSV file: a date column and numeric columns on a regular time step")
    date_column: str | None = Field(None, description="the CSV's date column (default: one named 'date', any case, "
                                                      "else the first column)")
    site: str | None = Field(None, description="one of the bundled weather sites (`edgefl sites` lists them)")
    source: Literal["sensors"] | None = Field(None, description="'sensors': readings from the [sensors] table's topics")
    columns: list[str] | None = Field(None, description="subset of columns to use (default: all)")
    gaps: GapPolicy = Field(GapPolicy(), description="missing timestamps and empty cells in csv, intervals "
                                                     "without a sensor reading: refuse, skip or fill")

    @model_validator(mode="after")
    def _one_source(self) -> "DataSource":
        if [self.csv, self.site, self.source].count(None) != 2:
            raise ValueError("give exactly one of csv or site, or source = 'sensors'")
        csv_only = sorted({"columns", "date_column"} & self.model_fields_set)
        if self.source == "sensors" and csv_only:
            raise ValueError(f"{', '.join(csv_only)}: not used with source = 'sensors' (the features are [sensors])")
        if self.site is not None and "gaps" in self.model_fields_set:
            raise ValueError("gaps: applies to csv data (the bundled sites have no gaps)")
        return self

    def load(self) -> SeriesTable:
        """The CSV file's or the site's table; sensor tables come from the agent's sensor store."""
        if self.source == "sensors":
            raise DataError("data.source = 'sensors': the table is built from the readings store "
                            "(edge_agent.sensors.SensorIngest.table), not loaded from a file")
        from edge_agent.data import load_csv, load_site  # here: pvlib (the sites) is heavy and a gateway needs neither

        if self.csv:
            return load_csv(self.csv, self.date_column, self.columns, self.gaps)
        table = load_site(self.site)
        return table.select(self.columns) if self.columns else table


class LiveGatewayConfig(BaseModel):
    """The tables of ``agent.toml`` a live gateway's sensor side reads: who it is, its state folder,
    ``[data]`` (``source = "sensors"``), ``[sensors]`` and ``[serving]``. The serving-only process
    validates only these, with the models ``AgentConfig`` uses, so it never imports the model zoo
    (torch); the other tables are ignored here and checked by ``edgefl agent run``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    client_id: str = Field(pattern=NAME_PATTERN)
    state_dir: Path
    data: DataSource
    sensors: SensorSettings
    serving: ServingSettings | None = None

    @model_validator(mode="after")
    def _sensor_data(self) -> LiveGatewayConfig:
        if self.data.source != "sensors":
            raise ValueError("data.source: a live gateway reads its [sensors]; set source = 'sensors'")
        return self


def load_config(path: Path, model: type[Config]) -> Config:
    """Parse ``path`` as TOML and validate it against ``model``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid TOML ({err})") from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        lines = problem_lines(err, model, lambda loc: f"{path}: {dotted(loc) or '(top level)'}")
        raise ConfigError("\n".join(lines)) from None


def dump_toml(data: dict) -> str:
    """Plain config data as TOML; ``None`` values (unset options) are left out. tomli-w is loaded
    here: a serving process reads its config and never writes one."""
    import tomli_w

    return tomli_w.dumps(_without_none(data))


def _without_none(data: dict) -> dict:
    return {k: _without_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}
