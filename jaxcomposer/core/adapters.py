"""Adapters: how objects of other frameworks (torch modules, torch DataLoaders) become ones jaxcomposer knows.

jaxcomposer never imports torch or ``torch_bridge``. A package that knows another framework's objects declares an
:class:`Adapter` under the Python entry point group ``jaxcomposer.adapters``; the entry point's *name* is the
framework's top-level package (``torch = "torch_bridge.adapter:ADAPTER"`` in ``pyproject.toml``). An object is
foreign when a class in its MRO comes from that package; only then is the entry point loaded (so runs that never
touch torch never import it). See docs/design.md, "The torch bridge".
"""
from __future__ import annotations

import functools
from importlib import metadata
from typing import Any, Callable, Mapping, NamedTuple

GROUP = "jaxcomposer.adapters"


class Adapter(NamedTuple):
    """What a framework bridge provides.

    ``is_model(obj)``: whether ``obj`` is a model of that framework. ``to_pure_model(obj, example_inputs)``: the
    model as a :class:`jaxcomposer.core.model.PureModel` (example inputs are numpy arrays from the first batch).
    ``to_loader(obj, name)``: the framework's data loader as an iterable of numpy batches, or None when ``obj`` is
    not one (``name`` is the argument, for error messages). ``surgery``: method name -> ``fn(module, **kwargs)``,
    the framework-level surgery a ``model``-slot method runs before conversion (see each method's card for the
    keywords and return value).
    """

    is_model: Callable[[Any], bool]
    to_pure_model: Callable[[Any, Any], Any]
    to_loader: Callable[[Any, str], Any] | None = None
    surgery: Mapping[str, Callable] = {}


@functools.cache
def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


@functools.cache
def _load(name: str) -> Adapter:
    adapter = _entry_points()[name].load()
    if not isinstance(adapter, Adapter):
        raise TypeError(f"entry point {name!r} in {GROUP!r} must name a jaxcomposer Adapter, got {type(adapter).__name__}")
    return adapter


def adapter_for(obj: Any) -> Adapter | None:
    """The adapter of the framework ``obj`` comes from, or None for objects jaxcomposer handles itself."""
    if obj is None:
        return None
    packages = {c.__module__.split(".")[0] for c in type(obj).__mro__}
    for name in _entry_points():
        if name in packages:
            return _load(name)
    return None


def is_foreign_model(obj: Any) -> bool:
    """Whether ``obj`` is another framework's model (a torch ``nn.Module``) that an adapter converts."""
    adapter = adapter_for(obj)
    return adapter is not None and adapter.is_model(obj)


def surgery(method: str, model: Any) -> Callable | None:
    """The framework-level surgery registered for ``method`` on ``model``'s framework, or None."""
    adapter = adapter_for(model)
    return None if adapter is None else adapter.surgery.get(method)
