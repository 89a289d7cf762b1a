"""Python's cyclic garbage collector paused around calls that trace or build many objects that live on.

Tracing a step allocates many objects that live through the trace, and the full collections they trigger scan every
object of a process holding JAX and torch; reference counting still frees what dies meanwhile, and cyclic garbage
waits for the next collection after the call. Beside ``allocator.py`` and ``cpu_threads.py``: how the process runs,
not what it computes.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
from typing import Callable


def collector_paused(fn: Callable) -> Callable:
    """``fn`` (a function or a jitted step) called with Python's cyclic garbage collector paused, and resumed after
    (unless it was off already): the full collections a trace triggers scan every object of the process
    (``benchmarks/README.md`` has what they cost the quickstart). Other attributes (``lower``, ``trace``) are
    ``fn``'s."""
    if not inspect.isfunction(fn):  # a jitted step: an object, whose lower() and trace() stay reachable
        return fn if isinstance(fn, _CollectorPaused) else _CollectorPaused(fn)

    @functools.wraps(fn)
    def paused(*args, **kwargs):
        with _paused_collector():
            return fn(*args, **kwargs)

    return paused


@contextlib.contextmanager
def _paused_collector():
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _CollectorPaused:
    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args, **kwargs):
        with _paused_collector():
            return self.fn(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.fn, name)
