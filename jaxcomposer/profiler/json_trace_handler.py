"""``JSONTraceHandler``: the profiler's events as Chrome trace JSON files (Perfetto, chrome://tracing)."""
from __future__ import annotations

import gzip
import json
import os
import pathlib
import threading
from pathlib import Path
from typing import Any, Sequence

from jaxcomposer.loggers.logger import dist_info
from jaxcomposer.profiler import trace_names
from jaxcomposer.profiler.trace_handler import TraceHandler

__all__ = ["JSONTraceHandler"]

_RANK_VARIABLES = ("{rank}", "{node_rank}", "{local_rank}")


class JSONTraceHandler(TraceHandler):
    """Composer's ``JSONTraceHandler``: one Chrome trace JSON file per profiling window.

    Open the files in https://ui.perfetto.dev or ``chrome://tracing``. Each is ``{"traceEvents": [...]}`` with
    complete events (``'ph': 'X'``, ``ts`` and ``dur`` in microseconds of wall-clock time) for durations, instant
    events (``'i'``) and counters (``'C'``), ``pid`` the process's rank and ``tid`` the OS thread id; metadata
    events name the process and its threads.

    Args:
        folder: format string for the folder of the traces (``{run_name}`` and the rank variables ``{rank}``,
            ``{local_rank}``, ``{world_size}``, ``{local_world_size}``, ``{node_rank}``), relative to the working
            directory as in Composer.
        filename: format string for each window's file inside ``folder``: the variables of ``folder`` plus the
            timestamp's (``{epoch}``, ``{batch}``, ``{batch_in_epoch}``, ``{sample}``, ``{sample_in_epoch}``,
            ``{token}``, ``{token_in_epoch}``, ``{total_wct}``, ``{epoch_wct}``, ``{batch_wct}``), read at the end of
            the window (after its last batch, as Composer: ``ba5`` after batches 0-4).
        remote_file_name, merged_trace_remote_file_name: uploading traces is not supported; anything but ``None``
            raises ``ValueError`` (Composer's defaults name remote files, which it uploads only when a remote
            uploader logger exists; here there is none).
        merged_trace_filename: format string (variables of ``folder``) of a file, inside ``folder``, holding every
            window's events together, rewritten after each window; ``None``: no merged file. Composer merges the
            ranks of a node; a JAX process drives its whole host, so here the merged file holds this process's
            windows. With several processes and a name without a rank variable, only rank 0 writes it.
        overwrite: ``False`` (Composer's default): ``folder`` must hold no files when training starts
            (``FileExistsError``).
        num_traces_to_keep: how many window files to keep, the oldest removed first; ``-1`` keeps all (the merged
            file keeps every window's events either way).

    Attributes:
        saved_traces: ``(timestamp, [path])`` for each window file written and still kept, oldest first.
    """

    def __init__(self, folder: str = "{run_name}/traces", filename: str = "ep{epoch}-ba{batch}-rank{rank}.json",
                 remote_file_name: str | None = None, merged_trace_filename: str | None = "merged_trace.json",
                 merged_trace_remote_file_name: str | None = None, *, overwrite: bool = False,
                 num_traces_to_keep: int = -1) -> None:
        for name, value in (("remote_file_name", remote_file_name),
                            ("merged_trace_remote_file_name", merged_trace_remote_file_name)):
            if value is not None:
                raise ValueError(f"JSONTraceHandler: {name}={value!r}: uploading traces to an object store is not "
                                 f"supported; pass {name}=None and copy the files from the trace folder yourself.")
        trace_names.check_pattern(folder, "JSONTraceHandler(folder)", with_time=False)
        trace_names.check_pattern(filename, "JSONTraceHandler(filename)", with_time=True)
        if merged_trace_filename is not None:
            trace_names.check_pattern(merged_trace_filename, "JSONTraceHandler(merged_trace_filename)", with_time=False)
        if isinstance(num_traces_to_keep, bool) or not isinstance(num_traces_to_keep, int) or num_traces_to_keep < -1:
            raise ValueError(f"JSONTraceHandler: num_traces_to_keep must be an int >= -1, got {num_traces_to_keep!r}")
        self.folder = folder
        self.filename = filename
        self.remote_file_name = None
        self.merged_trace_filename = merged_trace_filename
        self.merged_trace_remote_file_name = None
        self.overwrite = bool(overwrite)
        self.num_traces_to_keep = num_traces_to_keep
        self.saved_traces: list[tuple[Any, list[pathlib.Path]]] = []
        self._events: list[dict] = []
        self._thread_names: dict[int, str] = {}
        self._folder: Path | None = None
        self._run_name = ""
        self._rank = 0

    # ---- training events ----
    def init(self, state: Any, logger: Any) -> None:
        self._run_name = state.run_name
        self._rank = dist_info()["rank"]
        self._folder = Path(trace_names.format_name(self.folder, self._run_name, argument="JSONTraceHandler(folder)"))
        if not self.overwrite:
            trace_names.ensure_empty(self._folder, "JSONTraceHandler(folder)")
        self._folder.mkdir(parents=True, exist_ok=True)
        merged = self._merged_path()
        if merged is not None and merged.exists():  # a merged file from an earlier run would be extended
            merged.unlink()

    # ---- the profiler's windows ----
    def window_start(self, state: Any, logger: Any) -> None:
        rank = self._rank
        for name, args in (("process_name", {"name": f"Rank {rank} training loop process"}),
                           ("process_sort_index", {"sort_index": rank}), ("global_rank", {"value": rank})):
            self._events.append({"name": name, "ph": "M", "pid": rank, "tid": 0, "args": args})

    def window_end(self, state: Any, logger: Any) -> None:
        if self._folder is None:
            raise RuntimeError("JSONTraceHandler: the trace folder is made at Event.INIT, which has not run; add "
                               "the profiler to a Trainer (profiler=...) rather than calling it directly.")
        events, self._events = self._thread_metadata() + self._events, []
        path = self._folder / trace_names.format_name(self.filename, self._run_name, state.timestamp,
                                                 argument="JSONTraceHandler(filename)")
        _write_trace(path, events)
        self.saved_traces.append((state.timestamp, [path]))
        merged = self._merged_path()
        if merged is not None:
            earlier = _read_events(merged) if merged.exists() else []
            _write_trace(merged, _without_repeated_metadata(earlier + events))
        if self.num_traces_to_keep >= 0:
            while len(self.saved_traces) > self.num_traces_to_keep:
                for old in self.saved_traces.pop(0)[1]:
                    trace_names.remove(old)

    # ---- recorded events ----
    def process_duration_event(self, name: str, categories: Sequence[str], is_start: bool, timestamp: Any,
                               wall_clock_time_ns: int) -> None:
        self._record(name, categories, "B" if is_start else "E", wall_clock_time_ns, timestamp)

    def process_complete_event(self, name: str, categories: Sequence[str], timestamp: Any,
                               start_wall_clock_time_ns: int, end_wall_clock_time_ns: int) -> None:
        self._record(name, categories, "X", start_wall_clock_time_ns, timestamp,
                     dur=(end_wall_clock_time_ns - start_wall_clock_time_ns) / 1000)

    def process_instant_event(self, name: str, categories: Sequence[str], timestamp: Any,
                              wall_clock_time_ns: int) -> None:
        self._record(name, categories, "i", wall_clock_time_ns, timestamp, s="p")

    def process_counter_event(self, name: str, categories: Sequence[str], timestamp: Any, wall_clock_time_ns: int,
                              values: dict[str, int | float]) -> None:
        self._record(name, categories, "C", wall_clock_time_ns, None, args=dict(values))

    def process_chrome_json_trace_file(self, filepath: pathlib.Path) -> None:
        for event in _read_events(Path(filepath)):
            event["pid"] = self._rank  # one process per rank in the viewer, as Composer
            self._events.append(event)

    def _record(self, name: str, categories: Sequence[str], ph: str, wall_clock_time_ns: int, timestamp: Any,
                **fields: Any) -> None:
        tid = threading.get_native_id()
        if tid not in self._thread_names:
            thread = threading.current_thread()
            self._thread_names[tid] = "Training Loop" if thread is threading.main_thread() else thread.name
        event = {"name": name, "cat": ",".join(categories), "ph": ph, "ts": wall_clock_time_ns / 1000,
                 "pid": self._rank, "tid": tid}
        if timestamp is not None:
            event["args"] = {"epoch": int(timestamp.epoch), "batch": int(timestamp.batch)}
        event.update(fields)
        self._events.append(event)

    def _thread_metadata(self) -> list[dict]:
        main = threading.main_thread().native_id
        events = []
        for tid, name in self._thread_names.items():
            events.append({"name": "thread_name", "ph": "M", "pid": self._rank, "tid": tid, "args": {"name": name}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": self._rank, "tid": tid,
                           "args": {"sort_index": 0 if tid == main else 1}})  # the training loop first
        return events

    def _merged_path(self) -> Path | None:
        if self.merged_trace_filename is None or self._folder is None:
            return None
        per_rank = any(v in self.merged_trace_filename for v in _RANK_VARIABLES)
        if not per_rank and self._rank != 0:  # several processes would write one file over each other
            return None
        return self._folder / trace_names.format_name(self.merged_trace_filename, self._run_name,
                                                 argument="JSONTraceHandler(merged_trace_filename)")


def _write_trace(path: Path, events: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    os.replace(tmp, path)  # a viewer never opens half a file


def _read_events(path: Path) -> list[dict]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read().strip()
    if text.startswith("[") and not text.endswith("]"):  # the Chrome format allows an unterminated array
        text += "]"
    data = json.loads(text)
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise TypeError(f"{path}: a Chrome trace is a list of events or a dict with 'traceEvents', got "
                        f"{type(events).__name__}")
    return events


def _without_repeated_metadata(events: list[dict]) -> list[dict]:
    seen, kept = set(), []
    for event in events:
        if event.get("ph") == "M":
            key = (event.get("name"), event.get("pid"), event.get("tid"))
            if key in seen:
                continue
            seen.add(key)
        kept.append(event)
    return kept
