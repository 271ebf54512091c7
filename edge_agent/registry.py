"""Looking names up in the registries (backbones, learners, strategies, twins, exporters)."""

from __future__ import annotations

from collections.abc import Mapping


def registered(name: str, registry: Mapping[str, object], what: str) -> str:
    """``name`` when ``registry`` holds it, else a ValueError naming ``what`` and every valid name."""
    if name not in registry:
        raise ValueError(f"{what}: unknown {name!r}; choose one of {sorted(registry)}")
    return name
