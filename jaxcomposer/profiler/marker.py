"""``Marker``: a named range, instant or counter that the profiler records while its schedule says so."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, Sequence

from jaxcomposer.profiler.profiler_action import ProfilerAction

if TYPE_CHECKING:
    from jaxcomposer.profiler.profiler import Profiler

__all__ = ["Marker"]


class Marker:
    """Composer's ``Marker``: get one with :meth:`Profiler.marker`, then use it as a context manager, a decorator,
    or with ``start()``/``finish()``; ``instant()`` and ``counter(values)`` record points and values.

    A duration is recorded when the profiler's action at ``start()`` is one of ``actions`` (by default WARMUP,
    ACTIVE and ACTIVE_AND_SAVE), as one Chrome-trace complete event (``'ph': 'X'``) at ``finish()``. Otherwise
    ``start()`` and ``finish()`` only flip a flag: the training loop may keep markers around every phase.
    While the device trace runs (ACTIVE batches), the range is also a ``jax.profiler.TraceAnnotation`` (a
    ``StepTraceAnnotation`` numbered by the batch for a marker made with ``device_step=True``), so the device
    trace shows the same ranges next to the device's work.
    """

    def __init__(self, profiler: "Profiler", name: str, actions: Sequence[ProfilerAction],
                 record_instant_on_start: bool, record_instant_on_finish: bool, categories: Sequence[str],
                 device_step: bool = False) -> None:
        self.name = name
        self.actions = frozenset(ProfilerAction(a) for a in actions)
        self.categories = categories
        self.record_instant_on_start = record_instant_on_start
        self.record_instant_on_finish = record_instant_on_finish
        self.device_step = device_step
        self._profiler = profiler
        self._started = False
        self._start_ns: int | None = None  # set only when this start is being recorded
        self._start_timestamp: Any = None  # the run's timestamp at the start, which the event is labelled with
        self._annotation: Any = None

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"Attempted to start profiler event {self.name}; however, this marker is already "
                               "started")
        self._started = True
        if self._profiler._action_now() in self.actions:
            self._record_start()

    def finish(self) -> None:
        if not self._started:
            raise RuntimeError(f"Attempted to finish profiler event {self.name}; however, this profiler event is "
                               "not yet started")
        self._started = False
        if self._start_ns is not None:
            self._record_finish()

    def instant(self) -> None:
        if self._profiler._action_now() in self.actions:
            self._profiler._record_instant(self.name, self.categories, self._profiler._now_ns())

    def counter(self, values: dict[str, int | float]) -> None:
        if self._profiler._action_now() in self.actions:
            self._profiler._record_counter(self.name, self.categories, self._profiler._now_ns(), values)

    def _record_start(self) -> None:
        profiler = self._profiler
        self._annotation = profiler._annotation(self.name, self.device_step)
        if self._annotation is not None:
            self._annotation.__enter__()
        self._start_timestamp = profiler._timestamp()
        self._start_ns = profiler._now_ns()
        if self.record_instant_on_start:
            profiler._record_instant(self.name, self.categories, self._start_ns)

    def _record_finish(self) -> None:
        profiler = self._profiler
        end_ns = profiler._now_ns()
        if self._annotation is not None:
            self._annotation.__exit__(None, None, None)
            self._annotation = None
        start_ns, self._start_ns = self._start_ns, None
        profiler._record_complete(self.name, self.categories, self._start_timestamp, start_ns, end_ns)
        if self.record_instant_on_finish:
            profiler._record_instant(self.name, self.categories, end_ns)

    def __enter__(self) -> "Marker":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.finish()

    def __call__(self, func: Callable[..., Any] | None = None) -> Callable[..., Any]:
        if func is None:  # @marker() as well as @marker
            return self

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapped
