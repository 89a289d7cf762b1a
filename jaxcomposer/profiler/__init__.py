"""Composer's profiler (``composer.profiler``): what the training loop and the device do in chosen batches.

``Trainer(..., profiler=Profiler(schedule=cyclic_schedule(...), trace_handlers=[JSONTraceHandler(...)]))``
writes, for each profiling window, a Chrome trace JSON file of the loop's phases and events (Perfetto,
chrome://tracing) and a ``jax.profiler`` device trace (TensorBoard's profile plugin, XProf, Perfetto) where
Composer takes a torch profiler trace.
"""
from jaxcomposer.profiler.json_trace_handler import JSONTraceHandler
from jaxcomposer.profiler.marker import Marker
from jaxcomposer.profiler.profiler import Profiler
from jaxcomposer.profiler.profiler_action import ProfilerAction
from jaxcomposer.profiler.profiler_schedule import cyclic_schedule
from jaxcomposer.profiler.trace_handler import TraceHandler

__all__ = ["Profiler", "ProfilerAction", "cyclic_schedule", "JSONTraceHandler", "TraceHandler", "Marker"]
