"""The device trace: ``jax.profiler`` over each profiling window's ACTIVE batches (Composer's torch profiler)."""
from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import jax

from jaxcomposer.profiler import trace_names

# Composer's torch trace names end so; here the name is the window's folder (JAX's trace is a folder of files)
_FILE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json")


class DeviceTrace:
    """One ``jax.profiler.start_trace``/``stop_trace`` per profiling window, written to
    ``folder/<filename>/plugins/profile/<date>/``: ``<host>.xplane.pb`` (TensorBoard's profile plugin and XProf:
    ``tensorboard --logdir <folder>`` lists one run per window), ``<host>.trace.json.gz`` and
    ``perfetto_trace.json.gz`` (opens in https://ui.perfetto.dev).

    JAX writes a trace to the folder given when it starts, but the window's name (Composer's, with the batch at the
    window's end) is known only when it stops: the trace is written to a hidden folder and renamed then."""

    def __init__(self, folder: str, filename: str, overwrite: bool, num_traces_to_keep: int,
                 python_tracer: bool) -> None:
        trace_names.check_pattern(folder, "Profiler(torch_prof_folder)", with_time=False)
        trace_names.check_pattern(filename, "Profiler(torch_prof_filename)", with_time=True)
        for suffix in _FILE_SUFFIXES:
            if filename.endswith(suffix) and len(filename) > len(suffix):
                filename = filename[:-len(suffix)]
                break
        self.folder_pattern, self.filename = folder, filename
        self.overwrite, self.num_traces_to_keep = overwrite, num_traces_to_keep
        self.python_tracer = python_tracer
        self.saved_traces: list[Path] = []
        self.running = False
        self._folder: Path | None = None
        self._run_name = ""
        self._pending: Path | None = None

    def init(self, run_name: str) -> None:
        self._run_name = run_name
        self._folder = Path(trace_names.format_name(self.folder_pattern, run_name,
                                                    argument="Profiler(torch_prof_folder)"))
        if not self.overwrite:
            trace_names.ensure_empty(self._folder, "Profiler(torch_prof_folder)")
        self._folder.mkdir(parents=True, exist_ok=True)

    def start(self) -> None:
        assert self._folder is not None, "DeviceTrace.init runs at Event.INIT"
        self._pending = self._folder / f".window-in-progress-{os.getpid()}"
        trace_names.remove(self._pending)
        options = jax.profiler.ProfileOptions()
        # Composer's torch_prof_with_stack: Python frames in the trace (JAX records them by default; each Python
        # call then costs a trace event, so off unless asked, as torch's with_stack)
        options.python_tracer_level = 1 if self.python_tracer else 0
        try:
            jax.profiler.start_trace(self._pending, create_perfetto_trace=True, profiler_options=options)
        except RuntimeError as e:  # one trace per process: the user's own jax.profiler.trace may be running
            warnings.warn(f"Profiler: the device trace of this window was not taken ({e}); the JSON trace still "
                          "is", RuntimeWarning, stacklevel=2)
            return
        self.running = True

    def stop(self, timestamp: Any) -> Path:
        """Ends the trace (the caller waited for the device first) and names it with ``timestamp``."""
        jax.profiler.stop_trace()
        self.running = False
        assert self._folder is not None and self._pending is not None
        target = self._folder / trace_names.format_name(self.filename, self._run_name, timestamp,
                                                   argument="Profiler(torch_prof_filename)")
        if target.exists() and self.overwrite:
            trace_names.remove(target)
        n = 1
        while target.exists():  # two windows with one name (two fits ending at one batch): keep both
            target = target.with_name(f"{target.name}-{n}")
            n += 1
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self._pending, target)
        self.saved_traces.append(target)
        if self.num_traces_to_keep >= 0:
            while len(self.saved_traces) > self.num_traces_to_keep:
                trace_names.remove(self.saved_traces.pop(0))
        return target
