"""Speedup methods: Composer's class names and hyperparameters, each a factory returning a ``Method``.

One file per method holds its functional form, its factory, its method card (the module docstring) and its
``ENTRY`` (:class:`jaxcomposer.core.method.MethodEntry`). This package imports every such file and exports each
factory and functional form under its own name, so ``from jaxcomposer.algorithms import MixUp`` works and a new
method needs no edit here. Type checkers and IDEs read the same names from ``__init__.pyi``, which ``make stubs``
writes from this registry (``tests/test_public_api.py`` fails while it is stale).
"""
from __future__ import annotations

import importlib
import pkgutil
import re

from jaxcomposer.core.method import MethodEntry


def _discover() -> tuple[MethodEntry, ...]:
    entries = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        entry = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ENTRY", None)
        if entry is not None:
            entries.append(entry)
    return tuple(entries)


ENTRIES: tuple[MethodEntry, ...] = _discover()
# Composer's registry spellings (``composer/algorithms/algorithm_registry.py``) -> factory name in this package;
# the config loader resolves YAML ``algorithms:`` entries through it.
REGISTRY: dict[str, str] = {e.registry_name: e.factory.__name__ for e in ENTRIES}
FUNCTIONAL: dict[str, object] = {f.__name__: f for e in ENTRIES for f in e.functional}
globals().update({e.factory.__name__: e.factory for e in ENTRIES})
globals().update(FUNCTIONAL)


def describe_methods() -> list[tuple[str, str]]:
    """(registry name, one-line description) for every method: the first sentence of its method card's
    "What it does" paragraph."""
    out = []
    for e in sorted(ENTRIES, key=lambda e: e.registry_name):
        doc = importlib.import_module(e.factory.__module__).__doc__ or ""
        what = re.search(r"\*\*What it does\.\*\*\s*(.+?\.)(\s|$)", doc, re.S)
        line = " ".join((what.group(1) if what else doc.strip().splitlines()[0]).split())
        out.append((e.registry_name, line))
    return out


def method_card(name: str) -> str | None:
    """The method card (its file's docstring) of the method named ``name`` (registry or class name; case and
    underscores ignored), or None."""
    want = name.lower().replace("_", "")
    for e in ENTRIES:
        if want in (e.registry_name.replace("_", ""), e.factory.__name__.lower()):
            doc = importlib.import_module(e.factory.__module__).__doc__ or ""
            return f"{e.factory.__name__} ({e.registry_name})\n\n{doc.strip()}"
    return None


__all__ = ["ENTRIES", "FUNCTIONAL", "REGISTRY", "describe_methods", "method_card",
           *sorted(e.factory.__name__ for e in ENTRIES), *sorted(FUNCTIONAL)]
