"""The configuration reference, generated from the pydantic models that validate ``agent.toml``,
``coordinator.toml`` and ``aggregator.toml``: every key with its type, default and meaning, so the
page cannot drift from what the services accept."""

from __future__ import annotations

import enum
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class Key:
    """One configuration key: its dotted path, type, default and meaning."""

    path: str
    type: str
    default: str
    meaning: str


def config_models() -> dict[str, type[BaseModel]]:
    """Each config file and the model that validates it (imported here: the models pull in torch)."""
    from coordinator.config import AggregatorConfig, CoordinatorConfig
    from edge_agent.config import AgentConfig

    return {"agent.toml": AgentConfig, "coordinator.toml": CoordinatorConfig, "aggregator.toml": AggregatorConfig}


def nested_model(annotation: object) -> type[BaseModel] | None:
    """The model a field holds (directly, optionally, or as a list of tables), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = nested_model(arg)
        if found is not None:
            return found
    return None


def type_name(annotation: object) -> str:
    """A field's type as a reader of TOML thinks of it: ``int``, ``"open" | "closed"``, ``list[str]``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list[{type_name(args[0])}]" if args else "list"
    if origin is dict:
        return f"table[{type_name(args[0])}, {type_name(args[1])}]"
    if annotation is type(None):
        return "unset"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def bounds(info: FieldInfo) -> str:
    """The numeric and length bounds pydantic enforces on a field, e.g. ``>= 1, <= 1000000``."""
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <="}
    found = []
    for item in info.metadata:
        for name, sign in signs.items():
            value = getattr(item, name, None)
            if value is not None and isinstance(item, annotated_types.BaseMetadata):
                found.append(f"{sign} {value}")
    return ", ".join(found)


def default_text(info: FieldInfo) -> str:
    """The default as TOML would spell it; ``required`` where there is none."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.default if info.default_factory is None else info.default_factory()
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    return json.dumps(value if not isinstance(value, tuple) else list(value), default=str)


def meaning(info: FieldInfo, inner: type[BaseModel] | None) -> str:
    """A field's description; for a table without one, the first sentence of its model's docstring."""
    text = info.description or (inner.__doc__ or "").split(". ")[0] if inner is not None else info.description
    return " ".join((text or "").split())


def keys(model: type[BaseModel], prefix: str = "") -> list[Key]:
    """Every key of ``model``: plain keys first, then each table's row followed by its own keys."""
    found = []
    fields = sorted(model.model_fields.items(), key=lambda item: nested_model(item[1].annotation) is not None)
    for name, info in fields:
        path = f"{prefix}{name}"
        kind = type_name(info.annotation)
        limit = bounds(info)
        inner = nested_model(info.annotation)
        found.append(Key(path, f"{kind} ({limit})" if limit else kind, default_text(info), meaning(info, inner)))
        if inner is not None:
            found += keys(inner, f"{path}[]." if typing.get_origin(info.annotation) is list else f"{path}.")
    return found


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def render(models: dict[str, type[BaseModel]] | None = None) -> str:
    """The whole reference page."""
    models = models if models is not None else config_models()
    parts = ["# Configuration reference\n",
             "Generated from the pydantic models at every build of this site (`tools/sitegen/config_reference.py`); "
             "`tests/test_docs_site.py` checks that every field of every model is listed. A key `a.b` is `b` "
             "in the table `[a]`; `a[].b` is `b` in each `[[a]]` entry. Unknown keys are refused, and every "
             "error names the file and the field.\n"]
    for filename, model in models.items():
        parts.append(f"## {filename}\n\n{' '.join((model.__doc__ or '').split())} "
                     f"(`{model.__module__}.{model.__name__}`)\n")
        parts.append("| key | type | default | meaning |\n| --- | --- | --- | --- |")
        parts += [f"| `{k.path}` | {cell(k.type)} | `{cell(k.default)}` | {cell(k.meaning)} |" for k in keys(model)]
        parts.append("")
    return "\n".join(parts)
