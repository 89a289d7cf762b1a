"""``TraceHandler``: where the profiler's events go."""
from __future__ import annotations

import pathlib
from typing import Any, Sequence

from jaxcomposer.core.events import Callback

__all__ = ["TraceHandler"]


class TraceHandler(Callback):
    """Composer's base class for trace handlers: the :class:`~jaxcomposer.profiler.Profiler` hands every recorded
    event to each of its handlers, and forwards every training event to them (a handler is a callback).

    Composer's four methods are here with Composer's signatures (``process_duration_event``,
    ``process_instant_event``, ``process_counter_event``, ``process_chrome_json_trace_file``). Two things are
    added, because this profiler, not each handler, decides when a profiling window opens and closes:

    - ``process_complete_event``: a finished duration, given once with its start and end; by default it calls
      ``process_duration_event`` twice (start, then end), so a handler written for Composer works unchanged;
    - ``window_start`` / ``window_end``: called when a window opens (the first batch that is not ``SKIP``) and
      when it closes (after an ``ACTIVE_AND_SAVE`` batch, or at the end of an epoch or of ``fit`` if the window is
      still open): a handler writes its trace in ``window_end``.

    Timestamps are wall-clock nanoseconds (``time.time_ns()``'s clock), as in Composer.
    """

    def process_duration_event(self, name: str, categories: Sequence[str], is_start: bool, timestamp: Any,
                               wall_clock_time_ns: int) -> None:
        del name, categories, is_start, timestamp, wall_clock_time_ns

    def process_complete_event(self, name: str, categories: Sequence[str], timestamp: Any,
                               start_wall_clock_time_ns: int, end_wall_clock_time_ns: int) -> None:
        self.process_duration_event(name, categories, True, timestamp, start_wall_clock_time_ns)
        self.process_duration_event(name, categories, False, timestamp, end_wall_clock_time_ns)

    def process_instant_event(self, name: str, categories: Sequence[str], timestamp: Any,
                              wall_clock_time_ns: int) -> None:
        del name, categories, timestamp, wall_clock_time_ns

    def process_counter_event(self, name: str, categories: Sequence[str], timestamp: Any, wall_clock_time_ns: int,
                              values: dict[str, int | float]) -> None:
        del name, categories, timestamp, wall_clock_time_ns, values

    def process_chrome_json_trace_file(self, filepath: pathlib.Path) -> None:
        del filepath

    def window_start(self, state: Any, logger: Any) -> None:
        del state, logger

    def window_end(self, state: Any, logger: Any) -> None:
        del state, logger
