"""Hardware energy profiles: the energy of each operation on one target, each number with its source.

The energy report multiplies counted operations (MACs, spike-driven ACs, neuron updates) by these
costs. A number nobody can trace is worthless there, so the loader refuses one without a basis
and a source, and refuses whatever it does not understand instead of guessing. The file format is
documented in hw_profiles/README.md.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, StringConstraints, ValidationError
from pydantic import model_validator
from pydantic_core import ErrorDetails

import hw_profiles

PROFILE_DIR = Path(hw_profiles.__file__).resolve().parent
OpKind = Literal["mac", "ac", "neuron_update"]
OP_KINDS: tuple[str, ...] = get_args(OpKind)
Name = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]*$")]
Text = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the file, the field and the reason."""


class _Frozen(BaseModel):
    """Immutable once loaded, and no unknown keys: a typo must fail, not vanish."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class OpCost(_Frozen):
    """Energy of one operation in picojoules, and where that number comes from."""

    pj: float = Field(gt=0, allow_inf_nan=False, strict=True)
    basis: Literal["measured", "published", "derived"]
    source: Text
    note: Text | None = None
    # Other operations this figure already contains (an all-in number such as TrueNorth's),
    # so that the report does not charge them a second time.
    includes: tuple[OpKind, ...] = ()


class PrecisionOps(_Frozen):
    """The priced operations at one precision; an absent one is one the target cannot run."""

    mac: OpCost | None = None
    ac: OpCost | None = None
    neuron_update: OpCost | None = None


class HardwareProfile(_Frozen):
    """One hardware target: what each operation costs at each precision it supports."""

    name: Name
    description: Text
    default_precision: Name
    ops: dict[Name, PrecisionOps] = Field(min_length=1)
    _path: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _consistent(self) -> HardwareProfile:
        """Rules across fields: the default has a table, no table is empty, derived numbers show their
        arithmetic, and nothing is counted twice."""
        if self.default_precision not in self.ops:
            raise ValueError(
                f"default_precision: {self.default_precision!r} has no [ops.{self.default_precision}] table "
                f"(tables: {', '.join(self.ops)})"
            )
        for precision, table in self.ops.items():
            priced = {op: cost for op in OP_KINDS if (cost := getattr(table, op)) is not None}
            if not priced:
                raise ValueError(f"ops.{precision}: prices no operation (expected {', '.join(OP_KINDS)})")
            for op, cost in priced.items():
                field = f"ops.{precision}.{op}"
                if cost.basis == "derived" and cost.note is None:
                    raise ValueError(f"{field}.note: required for a derived number, to show the arithmetic")
                for inner in cost.includes:
                    if inner in priced:  # itself, or an op with its own price: charged twice
                        raise ValueError(
                            f"{field}.includes: {inner} has a price of its own in this table, "
                            "so it would be counted twice"
                        )
        return self

    @property
    def precisions(self) -> list[str]:
        """The precisions this profile prices, sorted."""
        return sorted(self.ops)

    def cost(self, op: str, precision: str | None = None) -> OpCost | None:
        """Cost of ``op`` at ``precision`` (the default when None); None if the target cannot run it."""
        if op not in OP_KINDS:
            known = ", ".join(OP_KINDS)
            raise ProfileError(f"{self._where()}: op: unknown operation {op!r} (known: {known})")
        chosen = self.default_precision if precision is None else precision
        if chosen not in self.ops:
            raise ProfileError(
                f"{self._where()}: ops.{chosen}: unknown precision {chosen!r} "
                f"(available: {', '.join(self.precisions)})"
            )
        return getattr(self.ops[chosen], op)

    def _where(self) -> str:
        return _display(self._path) if self._path else f"profile {self.name!r}"


def list_profiles() -> list[str]:
    """Names of the profiles shipped in ``hw_profiles/``."""
    return sorted(path.stem for path in PROFILE_DIR.glob("*.toml"))


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """Load and validate a profile: a bare name from ``hw_profiles/``, or any path to a TOML file."""
    path = _resolve(name_or_path)
    where = _display(path)
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ProfileError(f"{where}: cannot read the file: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{where}: invalid TOML: {exc}") from exc
    try:
        profile = HardwareProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{where}: " + "; ".join(_describe(error) for error in exc.errors())) from None
    if profile.name != path.stem:
        raise ProfileError(f"{where}: name: {profile.name!r} differs from the file name {path.stem!r}")
    profile._path = path
    return profile


def _resolve(name_or_path: str | Path) -> Path:
    """A path stays a path; a bare name must be one of the shipped profiles."""
    if isinstance(name_or_path, Path) or "/" in name_or_path or name_or_path.endswith(".toml"):
        return Path(name_or_path)
    path = PROFILE_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise ProfileError(
            f"unknown hardware profile {name_or_path!r}; available in {_display(PROFILE_DIR)}: "
            f"{', '.join(list_profiles()) or 'none'}"
        )
    return path


def _display(path: Path) -> str:
    """The path relative to the repository when it lies inside it, for short messages."""
    try:
        return str(path.resolve().relative_to(PROFILE_DIR.parent))
    except ValueError:
        return str(path)


def _describe(error: ErrorDetails) -> str:
    """One pydantic error as ``dotted.field: reason``."""
    location = ".".join(str(part) for part in error["loc"])
    reason = error["msg"].removeprefix("Value error, ")
    return f"{location}: {reason}" if location else reason
