"""Looking names up in the registries (backbones, learners, strategies, twins, exporters), and
registries whose names are known without importing their entries (``LazyRegistry``)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

Entry = TypeVar("Entry")


def registered(name: str, registry: Mapping[str, object], what: str) -> str:
    """``name`` when ``registry`` holds it, else a ValueError naming ``what`` and every valid name."""
    if name not in registry:
        raise ValueError(f"{what}: unknown {name!r}; choose one of {sorted(registry)}")
    return name


class LazyRegistry(Mapping[str, Entry], Generic[Entry]):
    """Name -> ``"module:attribute"`` under ``package``; an entry's module is imported when the entry
    is first looked up, so configs check names without importing torch-based classes."""

    def __init__(self, package: str, where: Mapping[str, str]) -> None:
        self.package, self.where = package, dict(where)

    def __getitem__(self, name: str) -> Entry:
        module, _, attribute = self.where[name].partition(":")
        return getattr(importlib.import_module(f"{self.package}.{module}"), attribute)

    def __contains__(self, name: object) -> bool:
        return name in self.where  # Mapping's own would import the entry

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)
