"""pydantic's validation errors as one short line per problem: where (a CLI flag or a config key,
named by the caller), what is wrong and what to do: no URLs, inputs shown only briefly, "did you
mean" for an unknown key. Torch-free: every config and every command uses it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

Location = tuple[int | str, ...]
SHOWN_INPUT_CHARS = 40
UNSHOWN_KINDS = {"value_error", "assertion_error", "extra_forbidden", "missing"}


def problem_lines(err: ValidationError, model: type[BaseModel] | None,
                  where: Callable[[Location], str]) -> list[str]:
    """One ``WHERE: REASON`` line per error of ``err`` (just the reason where ``where`` is empty);
    ``model``, the one validated, names the keys an unknown one may have meant (``None`` where no
    key can be unknown: CLI flags)."""
    return [": ".join(filter(None, (where(tuple(e["loc"])), reason(e, model)))) for e in err.errors()]


def dotted(loc: Location) -> str:
    """``("broker", "port")`` -> ``broker.port``; list positions as ``[i]``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")


def reason(error: dict[str, Any], model: type[BaseModel] | None) -> str:
    """What is wrong with one error, in words a user acts on."""
    kind, loc = error["type"], tuple(error["loc"])
    if kind == "extra_forbidden":
        from difflib import get_close_matches  # only here: a serving process never loads it

        known = field_names(model, loc[:-1])
        close = get_close_matches(str(loc[-1]), known, n=1)
        return "unknown key; " + (f"did you mean {close[0]!r}?" if close else f"the keys here are {', '.join(known)}")
    if kind == "missing":
        return "required: set it"
    text = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    text = text.replace("Input should", "should", 1)
    shown = error.get("input")
    if kind in UNSHOWN_KINDS or not isinstance(shown, (str, int, float, bool)):
        return text
    return f"{text}, got {_short(repr(shown))}"


def field_names(model: type[BaseModel] | None, loc: Location) -> list[str]:
    """The keys of the table at ``loc`` inside ``model`` (empty where ``loc`` is not a table)."""
    table: type[BaseModel] | None = model
    for part in loc:
        if table is None:
            return []
        if isinstance(part, str):
            field = table.model_fields.get(part)
            table = _table(field.annotation) if field else None
    return sorted(table.model_fields) if table else []


def _table(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (``Model``, ``Model | None``, ``list[Model]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next(filter(None, map(_table, get_args(annotation))), None)


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_INPUT_CHARS else text[: SHOWN_INPUT_CHARS - 3] + "..."
