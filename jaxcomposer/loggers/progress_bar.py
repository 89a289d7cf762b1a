"""``ProgressBarLogger``: one tqdm bar over the training steps, with loss, samples/s and tqdm's ETA.

The loss is read (``float()``, which waits for the step) at most every ``log_interval_s`` seconds, so the bar does not
turn the asynchronous training loop into a synchronous one. The latest evaluation metrics join the postfix.

Where the output goes decides the form (``mode='auto'``): a terminal gets the bar; a Jupyter kernel gets one
display updated in place (``mode='notebook'``: the same meter as text and HTML, refreshed at most every
``log_interval_s``; a saved notebook keeps its last state as one output, without widget state); anything else (a
CI log, a file) gets plain lines every ``line_interval_s`` seconds and at the end, never carriage-return
updates.
"""
from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from jaxcomposer.loggers.logger import LoggerDestination, format_metric, in_jupyter_kernel

__all__ = ["ProgressBarLogger"]


class ProgressBarLogger(LoggerDestination):
    """``stream`` defaults to ``sys.stderr`` (looked up at FIT_START, so test capture works)."""

    MODES = ("auto", "bar", "lines", "notebook")

    def __init__(self, log_interval_s: float = 0.5, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter, mode: str = "auto", line_interval_s: float = 30.0):
        if log_interval_s < 0:
            raise ValueError(f"log_interval_s must be >= 0, got {log_interval_s}.")
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}.")
        if line_interval_s < 0:
            raise ValueError(f"line_interval_s must be >= 0, got {line_interval_s}.")
        self.log_interval_s, self.line_interval_s = log_interval_s, line_interval_s
        self.stream, self.mode = stream, mode
        self._clock = clock
        self._bar = None
        self._lines = None  # lines mode: (stream, desc, total, start clock, batch at start, clock of the last line)
        self._display = None  # notebook mode: [display handle, desc, total, start clock, batch at start, last clock]
        self._postfix: dict[str, str] = {}
        self._last_read = None  # (clock time, samples) at the last loss read

    def fit_start(self, state, logger) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        desc, total = state.run_name or "train", state.total_steps or None
        in_notebook = self.stream is None and in_jupyter_kernel()
        mode = self.mode if self.mode != "auto" else "notebook" if in_notebook else \
            "bar" if getattr(stream, "isatty", lambda: False)() else "lines"
        self._last_read = (self._clock(), state.timestamp.sample)
        if mode == "notebook":
            from IPython.display import display
            now = self._clock()
            self._display = [None, desc, total, now, state.timestamp.batch, now]
            self._display[0] = display(self._meter(state.timestamp.batch), display_id=True)
            if self._display[0] is not None:
                return
            self._display, mode = None, "lines"  # (mode='notebook' outside a kernel: nothing to update)
        if mode == "lines":
            now = self._clock()
            self._lines = (stream, desc, total, now, state.timestamp.batch, now)
            return
        from tqdm.std import tqdm
        self._bar = tqdm(total=total, initial=state.timestamp.batch, desc=desc, unit="ba", file=stream,
                         dynamic_ncols=self.stream is None, mininterval=min(self.log_interval_s, 0.1), leave=True)

    def _meter(self, batch: int):
        """The notebook display: tqdm's meter line, as text and as an HTML progress bar."""
        from tqdm.std import tqdm
        _, desc, total, start, first, _ = self._display
        elapsed = self._clock() - start
        rate = (batch - first) / elapsed if elapsed > 0 and batch > first else None
        line = tqdm.format_meter(batch, total, elapsed, ncols=0, prefix=desc, unit="ba", rate=rate,
                                 postfix=", ".join(f"{k}={v}" for k, v in self._postfix.items()) or None)
        return _Meter(line, batch, total)

    def _show(self, batch: int, force: bool = False) -> None:
        now = self._clock()
        if force or now - self._display[5] >= self.log_interval_s:
            self._display[0].update(self._meter(batch))
            self._display[5] = now

    def _write_line(self, batch: int) -> None:
        from tqdm.std import tqdm
        stream, desc, total, start, first, _ = self._lines
        now = self._clock()
        elapsed = now - start
        rate = (batch - first) / elapsed if elapsed > 0 and batch > first else None
        line = tqdm.format_meter(batch, total, elapsed, ncols=0, prefix=desc, unit="ba", rate=rate,
                                 postfix=", ".join(f"{k}={v}" for k, v in self._postfix.items()) or None)
        stream.write(line + "\n")
        stream.flush()
        self._lines = (stream, desc, total, start, first, now)

    def batch_end(self, state, logger) -> None:
        if self._bar is None and self._lines is None and self._display is None:
            return
        now = self._clock()
        last_t, last_samples = self._last_read
        if now - last_t >= self.log_interval_s:
            loss = state.batch_metrics.get("loss")
            if loss is not None:
                self._postfix["loss"] = format_metric(float(loss))
                # float() waited for the step: take the time after it, or the wait lands in the next window
                # (which then holds one batch) and the rate alternates between far too high and far too low.
                now = self._clock()
            if now > last_t and state.timestamp.sample > last_samples:
                self._postfix["samples/s"] = f"{(state.timestamp.sample - last_samples) / (now - last_t):.1f}"
            self._last_read = (now, state.timestamp.sample)
            if self._bar is not None:
                self._bar.set_postfix(self._postfix, refresh=False)
        if self._bar is not None:
            self._bar.update(state.timestamp.batch - self._bar.n)
        elif self._display is not None:
            self._show(state.timestamp.batch)
        elif self._clock() - self._lines[5] >= self.line_interval_s:
            self._write_line(state.timestamp.batch)

    def eval_end(self, state, logger) -> None:
        if self._bar is None and self._lines is None and self._display is None:
            return
        for label, metrics in state.eval_metrics.items():
            for name, value in metrics.items():
                self._postfix[f"{label}/{name}"] = format_metric(float(value))
        if self._bar is not None:
            self._bar.set_postfix(self._postfix)
        if self._display is not None:
            self._show(state.timestamp.batch, force=True)
        # Eval time is not training throughput: restart the samples/s window after it.
        self._last_read = (self._clock(), state.timestamp.sample)

    def fit_end(self, state, logger) -> None:
        if self._bar is None and self._lines is None and self._display is None:
            return
        loss = state.batch_metrics.get("loss")
        if loss is not None:
            self._postfix["loss"] = format_metric(float(loss))
        if self._display is not None:
            self._show(state.timestamp.batch, force=True)
            self._display = None
            return
        if self._lines is not None:
            self._write_line(state.timestamp.batch)
            self._lines = None
            return
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(state.timestamp.batch - self._bar.n)
        self._bar.close()
        self._bar = None

    def close(self, state, logger) -> None:
        if self._bar is not None:  # the run failed before FIT_END
            self._bar.close()
            self._bar = None
        self._lines = self._display = None


class _Meter:
    """What the notebook shows: the meter line as text, and as an HTML progress bar with it."""

    def __init__(self, line: str, batch: int, total: int | None):
        self.line, self.batch, self.total = line, batch, total

    def __repr__(self) -> str:
        return self.line

    def _repr_html_(self) -> str:
        import html
        bar = f'<progress value="{self.batch}" max="{self.total}" style="width:30em"></progress> ' \
            if self.total else ""
        return f"<div>{bar}<code>{html.escape(self.line)}</code></div>"
