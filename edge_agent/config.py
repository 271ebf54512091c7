"""Loading TOML service configs into pydantic models, with errors that name the file and field."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

Config = TypeVar("Config", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and every bad field."""


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
        problems = "\n".join(
            f"  {'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in err.errors()
        )
        raise ConfigError(f"{path}: invalid configuration\n{problems}") from None


def dump_toml(data: dict) -> str:
    """Write plain config data (str, int, float, bool, lists of those, nested tables) as TOML."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"{key} = {_toml_value(value)}" for key, value in scalars.items()]
    for name, table in tables.items():
        lines.append("")
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items() if value is not None)
    return "\n".join(lines) + "\n"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        raise ValueError("nested tables deeper than one level are not supported")
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
