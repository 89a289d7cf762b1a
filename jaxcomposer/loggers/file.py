"""``FileLogger``: Composer's plain-text run log, one line per logged value, with stdout and stderr captured.

Line formats (Composer's):

- metrics: ``[metric][batch=<step>]: <name>: <value> `` (one line per metric, trailing space included);
- hyperparameters: ``[hyperparameter]: <name>: <value> ``;
- traces: ``[trace]: <name>:<value>``;
- captured output: ``[stdout]: <line>`` and ``[stderr]: <line>``.

Values are formatted as Composer's ``format_log_data_value`` (floats with 4 decimals, ints as they are, strings
quoted). A device value (the step's loss) is written once the device has computed it, so logging every batch does
not make the host wait for each step; at the end of an epoch, of an evaluation and of fit everything pending is
written. Lines keep their logging order among themselves; captured output is written as it comes, so it can
precede a metric line logged just before it.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, TextIO

from jaxcomposer.loggers.logger import (FlushingDestination, PendingMetrics, dist_info, format_log_data_value,
                                        to_host)

__all__ = ["FileLogger"]


class _Tee:
    """Stands in for ``sys.stdout``/``sys.stderr`` while the logger is open: text goes to the original stream and,
    prefixed, to the log file. Everything else is the original stream's."""

    def __init__(self, original: TextIO, prefix: str, owner: "FileLogger"):
        self._original, self._prefix, self._owner = original, prefix, owner
        self.active = True  # off once the logger closes, even if it could not put the original stream back

    def write(self, text: str) -> int:
        if self.active:
            self._owner.write(self._prefix, text)
        return self._original.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)


class FileLogger(FlushingDestination):
    """Composer's ``FileLogger``.

    Args:
        filename: path of the log file, a format string with ``{run_name}``, ``{rank}`` (``jax.process_index()``),
            ``{local_rank}``, ``{world_size}``, ``{local_world_size}`` and ``{node_rank}``. Relative paths are
            relative to the working directory, as in Composer. The file is opened at INIT (lines logged before
            are kept and written then); ``filename`` can be read from INIT on.
        remote_file_name: the log's name for destinations that upload files (``RemoteUploaderDownloader``), with
            ``filename``'s variables: at every flush the file is handed to ``logger.upload_file``, as Composer's
            (with no such destination nothing is uploaded); ``None``: never.
        overwrite: truncate an existing file; with ``False`` an existing file is an error (``FileExistsError``).
        capture_stdout, capture_stderr: copy what is written to ``sys.stdout`` / ``sys.stderr`` into the file
            while the logger is open (from INIT until ``close()``).
        buffer_size: ``open()``'s buffering (1: line-buffered).
        log_traces: write algorithm traces given to ``Logger.log_traces``.
        log_interval: write metrics logged during training only at batches that are a multiple of it (metrics
            logged by evaluations always go in).
        flush_interval: flush (and fsync) the file every this many batches and epochs, as Composer's; it is also
            flushed at EPOCH_START, EVAL_START, FIT_END and ``close()``.
    """

    def __init__(self, filename: str = "{run_name}/logs-rank{rank}.txt",
                 remote_file_name: str | None = "{run_name}/logs-rank{rank}.txt", *,
                 overwrite: bool = True, capture_stdout: bool = True, capture_stderr: bool = True,
                 buffer_size: int = 1, log_traces: bool = False, log_interval: int = 1, flush_interval: int = 100,
                 max_pending: int = 16) -> None:
        if remote_file_name is not None and (not isinstance(remote_file_name, str) or "://" in remote_file_name):
            raise ValueError(f"FileLogger: remote_file_name is the log's name in the bucket of a destination that "
                             f"uploads files (RemoteUploaderDownloader), a format string such as "
                             f"'{{run_name}}/logs-rank{{rank}}.txt', got {remote_file_name!r}")
        if not isinstance(filename, str) or not filename:
            raise ValueError(f"FileLogger: filename must be a non-empty format string, got {filename!r}.")
        if "://" in filename:  # written line by line, so it lives on the local disk; the bucket gets copies
            raise ValueError(f"FileLogger: filename={filename!r} is a URI; the log is written locally and uploaded "
                             "by a RemoteUploaderDownloader(bucket_uri=...) among the loggers, under "
                             "remote_file_name (as in Composer)")
        for name, value, low in (("log_interval", log_interval, 1), ("flush_interval", flush_interval, 1),
                                 ("buffer_size", buffer_size, -1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"FileLogger: {name} must be an int >= {low}, got {value!r}.")
        self.filename_format = filename
        self.remote_file_name = remote_file_name
        self._logger = None  # the run's Logger, to hand the file to its uploading destinations
        self.overwrite = bool(overwrite)
        self.capture_stdout, self.capture_stderr = bool(capture_stdout), bool(capture_stderr)
        self.buffer_size = buffer_size
        self.should_log_traces = bool(log_traces)
        self.log_interval = log_interval
        self.flush_interval = flush_interval
        self.file: TextIO | None = None
        self._run_name: str | None = None
        self._early: list[str] = []  # text written before INIT opened the file
        self._pending = PendingMetrics(max_pending, convert=to_host)
        self._at_line_start = True
        self._in_train_batch = False  # log_interval filters only what is logged between BATCH_START and eval
        self._tees: list[tuple[str, _Tee]] = []

    @property
    def filename(self) -> str:
        if self._run_name is None:
            raise RuntimeError("FileLogger.filename: the run name is known from Event.INIT on (the Trainer fires it "
                               "when it is constructed).")
        return self.filename_format.format(run_name=self._run_name, **dist_info())

    # ---- events ----
    def init(self, state, logger) -> None:
        if self.file is not None:
            raise RuntimeError("FileLogger: already open; use one FileLogger per Trainer.")
        self._run_name, self._logger = state.run_name, logger
        path = self.filename
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.file = open(path, "w" if self.overwrite else "x", buffering=self.buffer_size, encoding="utf-8")
        self.file.write("".join(self._early))
        self._early.clear()
        for name, wanted in (("stdout", self.capture_stdout), ("stderr", self.capture_stderr)):
            if wanted:
                tee = _Tee(getattr(sys, name), f"[{name}]: ", self)
                setattr(sys, name, tee)
                self._tees.append((name, tee))

    def epoch_start(self, state, logger) -> None:
        self._flush_file()

    def batch_start(self, state, logger) -> None:
        self._in_train_batch = True

    def batch_end(self, state, logger) -> None:
        if state.timestamp.batch % self.flush_interval == 0:
            self._flush_file()

    def epoch_end(self, state, logger) -> None:
        self._in_train_batch = False
        self.flush()
        if state.timestamp.epoch % self.flush_interval == 0:
            self._flush_file()

    def eval_start(self, state, logger) -> None:
        self._in_train_batch = False
        self._flush_file()

    def fit_end(self, state, logger) -> None:
        self._in_train_batch = False
        self.flush()
        self._flush_file()

    def close(self, state, logger) -> None:
        self._release_streams()
        if self.file is not None:
            self.flush()
            self._flush_file()
            self.file.close()
            self.file = None

    def _release_streams(self) -> None:
        # put back only a stream that is still ours: whoever replaced it since (pytest's capture) restores their own
        for name, tee in self._tees:
            tee.active = False
            if getattr(sys, name) is tee:
                setattr(sys, name, tee._original)
        self._tees.clear()

    # ---- logging ----
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._in_train_batch and step % self.log_interval != 0:
            return
        self._pending.push(step, metrics)
        self._write_records(self._pending.pop())

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self.flush()  # file order follows call order
        for name, value in hparams.items():
            self.write("[hyperparameter]: ", f"{name}: {format_log_data_value(value)} \n")

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        if self.should_log_traces:
            for name, trace in traces.items():
                self.write(f"[trace]: {name}:", format_log_data_value(trace) + "\n")

    def flush(self) -> None:
        """Write every pending metric line, waiting for device values if needed."""
        self._write_records(self._pending.pop(force=True))

    def _write_records(self, records) -> None:
        for r in records:
            for name, value in r.metrics.items():
                self.write(f"[metric][batch={r.step}]: ", f"{name}: {format_log_data_value(value)} \n")

    def write(self, prefix: str, text: str) -> None:
        """Append ``text`` with ``prefix`` at the start of each of its lines (a line continued across writes gets
        it once). Kept in memory until INIT opens the file."""
        out = []
        for line in text.splitlines(True):
            out.append(prefix + line if self._at_line_start and line != "\n" else line)
            self._at_line_start = line.endswith("\n")
        if self.file is None:
            self._early.append("".join(out))
        else:
            self.file.write("".join(out))

    def _flush_file(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            if self.remote_file_name is not None and self._logger is not None:
                name = self.remote_file_name.format(run_name=self._run_name, **dist_info())
                self._logger.upload_file(remote_file_name=name, file_path=self.filename, overwrite=True)
