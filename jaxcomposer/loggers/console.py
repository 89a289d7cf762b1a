"""``ConsoleLogger``: Composer's training lines at ``log_interval``, plus one line per evaluation and a summary at
FIT_END, for logs that outlive the progress bar.

Training lines are Composer's: the progress, then every metric logged since the last print, one per line::

    [epoch=1][batch=5/10]:
    	 Train loss/train/total: 0.5123

(``[batch=5/20]`` style when ``max_duration`` is not in epochs). A device value such as the step's loss is printed
once the device has computed it, so printing every batch does not make the host wait for each step; everything
pending is printed at EPOCH_END, before an evaluation's line and at FIT_END.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Mapping, TextIO

from jaxcomposer.core.time import Time, TimeUnit
from jaxcomposer.loggers.logger import LoggerDestination, PendingMetrics, format_log_data_value, format_metric, to_host

__all__ = ["ConsoleLogger"]

_EVAL_PREFIX = "metrics/"
_STREAMS = ("stdout", "stderr")


class ConsoleLogger(LoggerDestination):
    """Composer's ``ConsoleLogger(log_interval='1ba', stream=sys.stderr, log_traces=False)``.

    Args:
        log_interval: print the training metrics every this many batches (``'5ba'``) or epochs (``'1ep'``; a bare
            int is epochs, as in Composer). The first batch is always printed, and what was logged after the last
            print is printed at FIT_END.
        stream: ``'stderr'`` (default), ``'stdout'``, or a text stream. The names (and ``None``) are looked up at
            each print, so redirections and test capture apply.
        log_traces: print algorithm traces given to ``Logger.log_traces``.
        print_indices: (not a Composer argument) also print the run's absolute counters after the progress:
            ``[ba=12][sp=96]`` (and ``[tok=...]`` when tokens are counted).
        clock: the clock the FIT_END summary's wall time is measured with.
    """

    def __init__(self, log_interval: int | str | Time = "1ba", stream: str | TextIO | None = "stderr",
                 log_traces: bool = False, *, print_indices: bool = False,
                 clock: Callable[[], float] = time.perf_counter, max_pending: int = 16):
        interval = Time.from_input(log_interval, TimeUnit.EPOCH)
        if interval.unit not in (TimeUnit.EPOCH, TimeUnit.BATCH) or interval.value < 1:
            raise ValueError(f"ConsoleLogger: log_interval must be a positive number of epochs or batches ('1ep', "
                             f"'10ba', or an int of epochs), got {log_interval!r}.")
        if isinstance(stream, str) and stream.lower() not in _STREAMS:
            raise ValueError(f"ConsoleLogger: stream must be 'stdout', 'stderr' or a text stream, got {stream!r}.")
        self.log_interval = interval
        self.stream = stream.lower() if isinstance(stream, str) else stream
        self.should_log_traces = bool(log_traces)
        self.print_indices = bool(print_indices)
        self._clock = clock
        self._start = None
        self.hparams: dict[str, Any] = {}
        self._hparams_printed = False
        self.logged_metrics: dict[str, Any] = {}  # training metrics logged since the last print (latest value)
        self.last_logged_batch = 0
        self._in_eval = False
        self._prints = PendingMetrics(max_pending, convert=to_host)  # training prints waiting for device values
        self._logged_eval: dict[str, dict[str, float]] = {}
        self._best_accuracy: dict[str, float] = {}

    # ---- output ----
    def _resolve_stream(self) -> TextIO:
        if self.stream is None or self.stream == "stderr":
            return sys.stderr
        if self.stream == "stdout":
            return sys.stdout
        return self.stream

    def _print(self, line: str) -> None:
        stream = self._resolve_stream()
        from tqdm import tqdm
        tqdm.write(line, file=stream)  # clears and redraws an active progress bar instead of writing into it
        stream.flush()

    # ---- logging calls ----
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._in_eval:
            # Eval metrics are already host floats, so converting them here never waits for a training step.
            for key, value in metrics.items():
                if key.startswith(_EVAL_PREFIX):
                    label, _, name = key[len(_EVAL_PREFIX):].partition("/")
                    if name:
                        self._logged_eval.setdefault(label, {})[name] = float(value)
            return
        self.logged_metrics.update(metrics)

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self.hparams.update(hparams)

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        if self.should_log_traces:
            for name, trace in traces.items():
                self._print(f"[trace]: {name}:" + format_log_data_value(trace))

    # ---- training lines ----
    def _progress(self, state) -> str:
        ts, max_duration = state.timestamp, state.max_duration
        if max_duration is None:
            text = ""
        elif max_duration.unit == TimeUnit.EPOCH:
            epoch, batch = ts.epoch, ts.batch_in_epoch
            steps = state.steps_per_epoch
            if batch == 0 and epoch != 0:  # at EPOCH_END the counters already point at the next epoch
                epoch, batch = epoch - 1, steps if steps is not None else batch
            text = f"[epoch={epoch + 1}]" + (f"[batch={batch}]" if steps is None else f"[batch={batch}/{steps}]")
        else:
            unit = max_duration.unit
            text = f"[{unit.name.lower()}={ts.get(unit).value}/{max_duration.value}]"
        if self.print_indices:
            text += f"[ba={ts.batch}][sp={ts.sample}]" + (f"[tok={ts.token}]" if ts.token else "")
        return text

    def _queue_train_print(self, state) -> None:
        self._prints.push(state.timestamp.batch, self.logged_metrics, header=self._progress(state))
        self.last_logged_batch = state.timestamp.batch
        self.logged_metrics = {}
        self._release(force=False)

    def _release(self, force: bool) -> None:
        for record in self._prints.pop(force=force):
            text = record.context["header"] + (":" if record.metrics else "")
            for name, value in record.metrics.items():
                text += f"\n\t Train {name}: {format_log_data_value(value)}"
            self._print(text)

    def batch_end(self, state, logger) -> None:
        batch = state.timestamp.batch
        if self.log_interval.unit == TimeUnit.BATCH and \
                (batch % self.log_interval.value == 0 or self.last_logged_batch == 0):
            self._queue_train_print(state)
        elif self._prints:
            self._release(force=False)

    def epoch_end(self, state, logger) -> None:
        if self.log_interval.unit == TimeUnit.EPOCH and \
                (state.timestamp.epoch % self.log_interval.value == 0 or self.last_logged_batch == 0):
            self._queue_train_print(state)
        self._release(force=True)

    # ---- evaluation and summary ----
    def fit_start(self, state, logger) -> None:
        self._start = self._clock()
        if self.hparams and not self._hparams_printed:
            import yaml
            self._hparams_printed = True
            self._print("*" * 30 + "\nConfig:\n" + yaml.dump(self.hparams).rstrip("\n") + "\n" + "*" * 30)

    def eval_start(self, state, logger) -> None:
        self._in_eval = True

    def eval_end(self, state, logger) -> None:
        self._in_eval = False
        self._release(force=True)  # training lines first, in the order things happened
        # Prefer what was logged since the last EVAL_END: it names the evaluator that just ran.
        evaluated = self._logged_eval or {k: dict(v) for k, v in state.eval_metrics.items()}
        self._logged_eval = {}
        ts = state.timestamp
        for label, metrics in evaluated.items():
            for name, value in metrics.items():
                if "accuracy" in name.lower() and value == value:  # MulticlassAccuracy, MaskedAccuracy; skip NaN
                    key = f"{label}/{name}"
                    self._best_accuracy[key] = max(value, self._best_accuracy.get(key, value))
            text = "  ".join(f"{name}={format_metric(float(v))}" for name, v in metrics.items())
            self._print(f"[epoch {ts.epoch} batch {ts.batch}] {label}: {text}")

    def fit_end(self, state, logger) -> None:
        ts = state.timestamp
        if self.logged_metrics and self.last_logged_batch != ts.batch:
            self._queue_train_print(state)
        self._release(force=True)
        wall = self._clock() - self._start if self._start is not None else ts.total_wct.total_seconds()
        lines = [f"[fit end] {state.run_name}: {ts.batch} batches, {ts.epoch} epochs, {ts.sample} samples "
                 f"in {wall:.1f}s"]
        for label, metrics in state.eval_metrics.items():
            text = "  ".join(f"{name}={format_metric(float(v))}" for name, v in metrics.items())
            lines.append(f"  final {label}: {text}")
        for key, best in self._best_accuracy.items():
            lines.append(f"  best {key}: {format_metric(best)}")
        if state.stop_reason:
            lines.append(f"  stopped early: {state.stop_reason}")
        self._print("\n".join(lines))
