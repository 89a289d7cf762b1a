"""Composer's ``composer.core`` names: ``Algorithm``, ``State``, ``Event``, ``Time``, ``Timestamp``, ``TimeUnit``,
``Callback``, ``Evaluator``, ``DataSpec``, ``Precision``.

Loaded on first use (PEP 562), so importing a submodule such as ``jaxcomposer.core.time`` stays cheap and free of
import cycles. ``State`` is :class:`~jaxcomposer.core.run_state.RunState`, what callbacks receive.
"""
import importlib

_HOMES = {  # public name -> (module, attribute)
    "Algorithm": ("jaxcomposer.core.algorithm", "Algorithm"),
    "State": ("jaxcomposer.core.run_state", "RunState"), "Event": ("jaxcomposer.core.events", "Event"),
    "Callback": ("jaxcomposer.core.events", "Callback"),
    "Time": ("jaxcomposer.core.time", "Time"), "Timestamp": ("jaxcomposer.core.time", "Timestamp"),
    "TimeUnit": ("jaxcomposer.core.time", "TimeUnit"),
    "Evaluator": ("jaxcomposer.core.evaluator", "Evaluator"),
    "DataSpec": ("jaxcomposer.data.data_spec", "DataSpec"),
    "Precision": ("jaxcomposer.core.precision", "Precision"),
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        module, attribute = _HOMES[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'jaxcomposer.core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
