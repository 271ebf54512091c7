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
