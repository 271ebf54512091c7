"""CLI options declared by configuration fields: each option's type, default and help come from a
pydantic model's field, and its value goes back to that key, so a command and agent.toml /
coordinator.toml share one declaration per setting (``edgefl simulate`` uses it)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Optional, get_args, get_origin

import typer
from pydantic import BaseModel
from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class FieldOption:
    """``--<name>`` sets ``key`` (dotted, e.g. ``server.lr``) of ``model``. A tuple field is
    given comma-separated (``--anchors ets,theta``; empty for none)."""

    model: type[BaseModel]
    key: str
    name: str

    @property
    def field(self) -> FieldInfo:
        *tables, last = self.key.split(".")
        table = self.model
        for part in tables:
            table = _nested(table.model_fields[part].annotation)
        return table.model_fields[last]

    @property
    def listed(self) -> bool:
        """Given as a comma-separated list (a tuple field)."""
        return _holds_tuple(self.field.annotation)

    def parameter(self) -> inspect.Parameter:
        """The typer option: the field's type, default and description."""
        field, default = self.field, self.field.get_default(call_default_factory=True)
        kind = field.annotation
        if self.listed:
            kind, default = Optional[str], None if default is None else ",".join(map(str, default))
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=Annotated[kind, typer.Option(help=field.description or "")])

    def value(self, given: Any) -> Any:
        """The CLI value as the field takes it."""
        if self.listed and given is not None:
            return tuple(item.strip() for item in given.split(",") if item.strip())
        return given


def _holds_tuple(annotation: object) -> bool:
    """``tuple[...]``, also inside ``Annotated`` or ``| None``."""
    return get_origin(annotation) is tuple or any(map(_holds_tuple, get_args(annotation)))


def _nested(annotation: object) -> type[BaseModel]:
    return annotation if isinstance(annotation, type) else next(a for a in get_args(annotation) if isinstance(a, type))


class ModelOptions:
    """Options for fields of several models: ``{model: keys}``; ``names`` renames an option
    (default: the key with dots as underscores)."""

    def __init__(self, fields: Mapping[type[BaseModel], tuple[str, ...]], names: Mapping[str, str]) -> None:
        self.options = [FieldOption(model, key, names.get(key, key.replace(".", "_")))
                        for model, keys in fields.items() for key in keys]
        if len({o.name for o in self.options}) != len(self.options):
            raise ValueError(f"two options with one name: {sorted(o.name for o in self.options)}")

    def signature(self, command: Callable[..., None]) -> inspect.Signature:
        """``command``'s own parameters (all but ``**settings``) followed by these options."""
        own = inspect.signature(command, eval_str=True)
        kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        return own.replace(parameters=[*kept, *(o.parameter() for o in self.options)])

    def values(self, model: type[BaseModel], settings: Mapping[str, Any],
               only: Collection[str] | None = None) -> dict[str, Any]:
        """The keys of ``model`` the options set (those named in ``only``, if given), nested as in
        its TOML table."""
        tree: dict[str, Any] = {}
        for option in (o for o in self.options if o.model is model and (only is None or o.name in only)):
            *tables, last = option.key.split(".")
            node = tree
            for table in tables:
                node = node.setdefault(table, {})
            node[last] = option.value(settings[option.name])
        return tree

    @property
    def flags(self) -> dict[str, str]:
        """Config key -> the flag that sets it (for error messages)."""
        return {o.key: "--" + o.name.replace("_", "-") for o in self.options}
