"""Torch-level surgery of jaxcomposer's ``model``-slot methods, one module per method.

Each module here defines ``SURGERY = {"MethodName": function}``: the function the method's native file in
``jaxcomposer/algorithms/`` looks up with ``jaxcomposer.core.adapters.surgery("MethodName", module)`` when the task
is built on a ``torch.nn.Module``. It edits that module in place, before the bridge exports it, as Composer's
surgery does; its signature and return value are the method's own (its native file documents them). This package
collects every module's ``SURGERY``, so a new method needs no edit here or in the adapter.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable


def _discover() -> dict[str, Callable]:
    found: dict[str, Callable] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        for name, fn in getattr(importlib.import_module(f"{__name__}.{info.name}"), "SURGERY", {}).items():
            if name in found:
                raise RuntimeError(f"torch_bridge.methods: two modules register surgery for {name!r}")
            found[name] = fn
    return found


SURGERY: dict[str, Callable] = _discover()
