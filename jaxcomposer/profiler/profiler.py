"""``Profiler``: Composer's profiler, a callback that records what the training loop does in chosen batches."""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax

from jaxcomposer.core.events import Callback, Event
from jaxcomposer.profiler.device_trace import DeviceTrace
from jaxcomposer.profiler.marker import Marker
from jaxcomposer.profiler.profiler_action import ProfilerAction
from jaxcomposer.profiler.system_profiler import SystemProfiler
from jaxcomposer.profiler.trace_handler import TraceHandler

__all__ = ["Profiler"]

_RECORDING = (ProfilerAction.WARMUP, ProfilerAction.ACTIVE, ProfilerAction.ACTIVE_AND_SAVE)
_DEVICE_TRACED = (ProfilerAction.ACTIVE, ProfilerAction.ACTIVE_AND_SAVE)
# Composer's engine records each start/end pair of events as one duration named by what they bracket. Fit and
# epoch are instants here: their ranges span many windows, so each window's file would hold a piece
_PAIRS = {Event.BATCH_START: ("event/batch", True), Event.BATCH_END: ("event/batch", False),
          Event.EVAL_START: ("event/eval", True), Event.EVAL_END: ("event/eval", False),
          Event.PREDICT_START: ("event/predict", True), Event.PREDICT_END: ("event/predict", False)}


class Profiler(Callback):
    """Composer's ``Profiler``: ``Trainer(..., profiler=Profiler(schedule=cyclic_schedule(...),
    trace_handlers=[JSONTraceHandler(...)]))``.

    Every batch, at BATCH_START, ``schedule(state)`` says what to do (:class:`ProfilerAction`). The batches that
    are not SKIP form windows (with :func:`cyclic_schedule`: ``warmup`` then ``active`` batches); during a window:

    - markers record: the Trainer's phases (``dataloader/train``: waiting for the next batch; ``step``: the
      compiled train step, host side: dispatch, and the wait when the host is ahead; ``eval/<label>``;
      ``checkpoint``), the training events (``event/batch``, ``event/eval``, ``event/predict`` as durations from
      their start event to their end event, as Composer's engine records them; the others as instants named by
      the event: ``event/fit_start``, ``event/epoch_start``, ``event/eval_batch_end``, ...) and your own markers
      (:meth:`marker`);
    - host counters are sampled (``sys_prof_*``, see :class:`~jaxcomposer.profiler.system_profiler.SystemProfiler`);
    - during ACTIVE batches, the device trace runs: Composer's torch profiler becomes ``jax.profiler``, started at
      the first ACTIVE batch of a window and stopped after the window's last one, once the device has finished
      it. One trace per window, in ``torch_prof_folder/<torch_prof_filename>`` (see the arguments), with the
      markers' ranges as ``TraceAnnotation``s next to the device's work.

    A window ends after its ACTIVE_AND_SAVE batch (or at the end of the epoch or of ``fit``, if still open): each
    trace handler then writes its trace (:class:`JSONTraceHandler`: one Chrome trace JSON file per window).
    Outside windows a marker only checks the action (about 0.3 microseconds).

    As in Composer, the action between two batches is the next batch's (the timestamp has moved on): the data
    loading of a window's first batch is in the window, and an evaluation or a checkpoint after a window's last
    batch is not (it goes to the next window when that batch is one). Nothing is recorded outside ``fit``. With
    ``steps_per_execution > 1`` a compiled call trains several batches before their events: its ``step`` range
    comes before their ``event/batch`` ranges, and the device trace starts with the next call.

    Args:
        schedule: ``(state) -> ProfilerAction``, asked once per batch (the answer is kept until the timestamp
            changes), e.g. :func:`cyclic_schedule`.
        trace_handlers: a :class:`TraceHandler` or a list of them; they also receive every training event.
        sys_prof_cpu, sys_prof_memory, sys_prof_disk, sys_prof_net: host counters to record (Composer's).
        sys_prof_stats_thread_interval_seconds: seconds between two samples of the counters.
        torch_prof_folder: format string (``{run_name}``, ``{rank}``, ...) of the folder of the device traces.
            Composer's default folder name is kept: ``'{run_name}/torch_traces'``.
        torch_prof_filename: format string (also ``{epoch}``, ``{batch}``, ...; read at the window's end) naming
            each window's trace folder inside ``torch_prof_folder``; it is a folder, since JAX writes several
            files: a Composer file name's ``.pt.trace.json`` (or ``.json``) ending is dropped.
        torch_prof_overwrite: ``False``: ``torch_prof_folder`` must hold no files when training starts.
        torch_prof_with_stack: record Python frames in the device trace (JAX's Python tracer; costly).
        torch_prof_record_shapes, torch_prof_profile_memory, torch_prof_with_flops: the device trace always has
            the compiled programs' shapes, memory and cost analysis; as in Composer, the device trace is taken
            when any of these or ``torch_prof_with_stack`` is True (the defaults), and not at all when all four are
            False.
        torch_prof_use_gzip: accepted; JAX writes its traces gzipped (``*.trace.json.gz``) and as XPlane
            protobufs (``*.xplane.pb``) either way.
        torch_prof_num_traces_to_keep: how many window traces to keep (``-1``: all), the oldest removed first.
        torch_prof_remote_file_name, torch_prof_memory_remote_file_name: uploading is not supported; anything but
            ``None`` raises ``ValueError``.
        torch_prof_memory_filename: torch's memory timeline has no JAX counterpart; anything but ``None`` raises
            ``ValueError`` (``jax.profiler.save_device_memory_profile`` writes a device memory profile, and
            :class:`~jaxcomposer.callbacks.MemoryMonitor` logs device memory every batch).

    Attributes:
        state: the run state, bound at ``Event.INIT`` (Composer's ``bind_to_state``).
        resumption_batch_idx: ``batch_in_epoch`` when the run started (non-zero after a resumption), which
            :func:`cyclic_schedule` adds to ``skip_first`` (through ``state.profiler``).
    """

    def __init__(self, schedule: Callable[[Any], ProfilerAction], trace_handlers: TraceHandler | Sequence[TraceHandler],
                 sys_prof_cpu: bool = True, sys_prof_memory: bool = False, sys_prof_disk: bool = False,
                 sys_prof_net: bool = False, sys_prof_stats_thread_interval_seconds: float = 0.5,
                 torch_prof_folder: str = "{run_name}/torch_traces", torch_prof_filename: str = "rank{rank}.{batch}",
                 torch_prof_remote_file_name: str | None = None, torch_prof_memory_filename: str | None = None,
                 torch_prof_memory_remote_file_name: str | None = None, torch_prof_overwrite: bool = False,
                 torch_prof_use_gzip: bool = False, torch_prof_record_shapes: bool = False,
                 torch_prof_profile_memory: bool = True, torch_prof_with_stack: bool = False,
                 torch_prof_with_flops: bool = True, torch_prof_num_traces_to_keep: int = -1) -> None:
        if not callable(schedule):
            raise ValueError(f"Profiler: schedule must be a function (state) -> ProfilerAction such as "
                             f"cyclic_schedule(), got {schedule!r}")
        for name, value in (("torch_prof_remote_file_name", torch_prof_remote_file_name),
                            ("torch_prof_memory_remote_file_name", torch_prof_memory_remote_file_name)):
            if value is not None:
                raise ValueError(f"Profiler: {name}={value!r}: uploading traces to an object store is not "
                                 f"supported; pass {name}=None and copy the files from torch_prof_folder yourself.")
        if torch_prof_memory_filename is not None:
            raise ValueError(f"Profiler: torch_prof_memory_filename={torch_prof_memory_filename!r}: torch's memory "
                             "timeline has no JAX counterpart; pass None. For device memory use "
                             "jax.profiler.save_device_memory_profile(path) or the MemoryMonitor callback.")
        flags = {"sys_prof_cpu": sys_prof_cpu, "sys_prof_memory": sys_prof_memory, "sys_prof_disk": sys_prof_disk,
                 "sys_prof_net": sys_prof_net, "torch_prof_overwrite": torch_prof_overwrite,
                 "torch_prof_use_gzip": torch_prof_use_gzip, "torch_prof_record_shapes": torch_prof_record_shapes,
                 "torch_prof_profile_memory": torch_prof_profile_memory,
                 "torch_prof_with_stack": torch_prof_with_stack, "torch_prof_with_flops": torch_prof_with_flops}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ValueError(f"Profiler: {name} must be True or False, got {value!r}")
        interval = sys_prof_stats_thread_interval_seconds
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ValueError(f"Profiler: sys_prof_stats_thread_interval_seconds must be a number > 0, got "
                             f"{interval!r}")
        keep = torch_prof_num_traces_to_keep
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < -1:
            raise ValueError(f"Profiler: torch_prof_num_traces_to_keep must be an int >= -1, got {keep!r}")
        handlers = [trace_handlers] if isinstance(trace_handlers, TraceHandler) else list(trace_handlers or ())
        for i, handler in enumerate(handlers):
            if not isinstance(handler, TraceHandler):
                raise ValueError(f"Profiler: trace_handlers[{i}] is a {type(handler).__name__}, expected a "
                                 "TraceHandler such as JSONTraceHandler(...)")

        self.schedule = schedule
        self._trace_handlers = handlers
        self.state: Any = None
        self.resumption_batch_idx = 0
        self.remote_filenames: list[str] = []  # Composer's attribute; nothing is uploaded here
        self._system = SystemProfiler(sys_prof_cpu, sys_prof_memory, sys_prof_disk, sys_prof_net, float(interval)) \
            if (sys_prof_cpu or sys_prof_memory or sys_prof_disk or sys_prof_net) else None
        wants_device = torch_prof_record_shapes or torch_prof_profile_memory or torch_prof_with_stack or \
            torch_prof_with_flops
        self._device = DeviceTrace(torch_prof_folder, torch_prof_filename, torch_prof_overwrite, keep,
                                   python_tracer=torch_prof_with_stack) if wants_device else None
        self._markers: dict[str, Marker] = {}
        # wall-clock time read through the monotonic clock: durations never go negative when NTP steps the clock
        self._clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self._live: Any = None  # the state while fit runs: markers outside fit record nothing
        self._action_ts: Any = None
        self._action = ProfilerAction.SKIP
        self._window_open = False
        self._save_at_batch_end = False

    # ---- Composer's API ----
    @property
    def trace_handlers(self) -> list[TraceHandler]:
        return self._trace_handlers

    @trace_handlers.setter
    def trace_handlers(self, trace_handlers: TraceHandler | Sequence[TraceHandler]) -> None:
        self._trace_handlers[:] = [trace_handlers] if isinstance(trace_handlers, TraceHandler) else trace_handlers

    @property
    def device_traces(self) -> list:
        """The folders of the device traces written and still kept, oldest first."""
        return list(self._device.saved_traces) if self._device is not None else []

    def bind_to_state(self, state: Any) -> None:
        """Attach to a run's state (the Trainer does it, through ``Event.INIT``); one Profiler serves one run."""
        if self.state is not None and self.state is not state:
            raise RuntimeError("Profiler: already bound to another Trainer's state; create one Profiler per Trainer")
        self.state = state

    def marker(self, name: str, actions: Sequence[ProfilerAction] = _RECORDING, record_instant_on_start: bool = False,
               record_instant_on_finish: bool = False, categories: Sequence[str] = (), *,
               device_step: bool = False) -> Marker:
        """The :class:`Marker` called ``name``, made on first use (later calls return it, with these
        ``categories``). ``actions``: the actions during which it records. ``device_step=True``: in the device
        trace, the range is a ``StepTraceAnnotation`` numbered by the batch, which TensorBoard's profile plugin
        uses for its per-step analysis (the Trainer marks its train step so)."""
        marker = self._markers.get(name)
        if marker is None:
            marker = self._markers[name] = Marker(self, name, actions, record_instant_on_start,
                                                  record_instant_on_finish, categories, device_step)
        marker.categories = categories
        return marker

    def marked_iter(self, name: str, iterable: Iterable) -> Iterator:
        """``iterable``'s items, each ``next()`` inside the marker ``name``: the time the loop waits for data
        (the Trainer's ``dataloader/train``). Closing this iterator closes ``iterable``'s."""
        marker = self.marker(name, categories=("dataloader",))
        it = iter(iterable)
        try:
            while True:
                with marker:
                    try:
                        item = next(it)
                    except StopIteration:
                        return
                yield item
        finally:
            close = getattr(it, "close", None)
            if close is not None:  # a prefetching generator stops its thread when closed
                close()

    def record_chrome_json_trace_file(self, filepath: Any) -> None:
        """Hand the events of a Chrome JSON trace file to the trace handlers (Composer's API for external
        profilers' traces)."""
        for handler in self._trace_handlers:
            handler.process_chrome_json_trace_file(filepath)

    def flush(self, state: Any = None) -> None:
        """Close an open window now: stop the device trace and write the traces. The end of an epoch and of
        ``fit`` do it; call it where ``fit`` ends otherwise (an exception), so no trace stays running."""
        state = state if state is not None else self.state
        if self._window_open and state is not None:
            self._close_window(state, None)
        self._live = None

    # ---- the callback ----
    def run_event(self, event: Event, state: Any, logger: Any) -> None:
        if event is Event.INIT:
            self._init(state)
        elif event is Event.FIT_START:
            self._live, self._action_ts = state, None
        elif event is Event.BATCH_START:
            self._batch_start(state, logger)
        self._mark_event(event)
        for handler in self._trace_handlers:
            handler.run_event(event, state, logger)
        if event is Event.BATCH_END and self._save_at_batch_end:
            self._close_window(state, logger)
        elif event is Event.EPOCH_END and self._window_open:
            self._close_window(state, logger)
        elif event is Event.FIT_END:
            if self._window_open:
                self._close_window(state, logger)
            self._live = None

    def close(self, state: Any, logger: Any) -> None:
        self.flush(state)
        for handler in self._trace_handlers:
            handler.close(state, logger)

    def _init(self, state: Any) -> None:
        self.bind_to_state(state)
        # Composer reads it after loading a checkpoint; the Trainer here has resumed before INIT
        self.resumption_batch_idx = int(state.timestamp.batch_in_epoch)
        if self._device is not None:
            self._device.init(state.run_name)

    def _batch_start(self, state: Any, logger: Any) -> None:
        action = self._action_now()
        if action is ProfilerAction.SKIP:
            if self._window_open:  # a schedule that left a window without ACTIVE_AND_SAVE: write it anyway
                self._close_window(state, logger)
            return
        if not self._window_open:
            self._window_open = True
            for handler in self._trace_handlers:
                handler.window_start(state, logger)
            if self._system is not None:
                self._system.start(self)
        if action in _DEVICE_TRACED and self._device is not None and not self._device.running:
            self._device.start()
        self._save_at_batch_end = action is ProfilerAction.ACTIVE_AND_SAVE

    def _close_window(self, state: Any, logger: Any) -> None:
        self._window_open = self._save_at_batch_end = False
        if self._system is not None:
            self._system.stop()
        if self._device is not None and self._device.running:
            train_state = getattr(state, "train_state", None)
            if train_state is not None:
                try:  # the last traced step runs on the device still (asynchronous dispatch): trace it to its end
                    jax.block_until_ready(train_state)
                except RuntimeError:  # buffers already donated to a step that failed: nothing more to wait for
                    pass
            self._device.stop(state.timestamp)
        for handler in self._trace_handlers:
            handler.window_end(state, logger)

    def _mark_event(self, event: Event) -> None:
        pair = _PAIRS.get(event)
        if pair is None:
            # between batches the action is the next batch's (Composer's rule, so a window's first batch comes with
            # its data loading): the end of an epoch or of fit closes what came before, so it belongs to the
            # window still open, if any, not to the next
            if event not in (Event.EPOCH_END, Event.FIT_END) or self._window_open:
                self.marker(f"event/{event.value}").instant()
            return
        marker = self.marker(pair[0])
        if pair[1]:
            if not marker._started:  # (a run cut short by an exception left it started)
                marker.start()
        elif marker._started:
            marker.finish()

    # ---- what markers use ----
    def _action_now(self) -> ProfilerAction:
        state = self._live
        if state is None:
            return ProfilerAction.SKIP
        timestamp = state.timestamp
        if timestamp is not self._action_ts:  # a Timestamp is replaced, never changed, when training advances
            self._action_ts = timestamp
            self._action = ProfilerAction(self.schedule(state))
        return self._action

    def _now_ns(self) -> int:
        return time.perf_counter_ns() + self._clock_offset_ns

    def _annotation(self, name: str, device_step: bool) -> Any:
        if self._device is None or not self._device.running:
            return None
        if device_step and self._live is not None:
            return jax.profiler.StepTraceAnnotation(name, step_num=int(self._live.timestamp.batch))
        return jax.profiler.TraceAnnotation(name)

    def _timestamp(self) -> Any:
        state = self._live if self._live is not None else self.state
        return None if state is None else state.timestamp

    def _record_complete(self, name: str, categories: Sequence[str], timestamp: Any, start_ns: int,
                         end_ns: int) -> None:
        for handler in self._trace_handlers:
            handler.process_complete_event(name, categories, timestamp, start_ns, end_ns)

    def _record_instant(self, name: str, categories: Sequence[str], wall_clock_time_ns: int) -> None:
        timestamp = self._timestamp()
        for handler in self._trace_handlers:
            handler.process_instant_event(name, categories, timestamp, wall_clock_time_ns)

    def _record_counter(self, name: str, categories: Sequence[str], wall_clock_time_ns: int,
                        values: dict[str, int | float]) -> None:
        timestamp = self._timestamp()
        for handler in self._trace_handlers:
            handler.process_counter_event(name, categories, timestamp, wall_clock_time_ns, values)
