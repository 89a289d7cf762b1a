"""The ``Logger`` facade, the ``LoggerDestination`` base, and a queue that keeps logging off the step's critical path.

Composer's algorithms and callbacks log through one ``Logger`` that fans out to destinations. Destinations are also
callbacks, so they see every event (the trainer fires each event on them too) and can read the ``RunState``.

Values arrive as Python numbers or as device scalars. ``float()`` on a device scalar waits for the step that produced
it, so a destination that converts eagerly on every batch would serialise the host with the device. Destinations that
write every logged value therefore queue them in ``PendingMetrics`` and convert only values that are already computed
(or at sync points such as EPOCH_END / EVAL_END / FIT_END). Consequence for callers: do not log buffers that will be
donated to the next step (e.g. leaves of ``train_state``); log step outputs such as the loss.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import sys
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from jaxcomposer.core.events import Callback

__all__ = ["Logger", "LoggerDestination", "FlushingDestination", "PendingMetrics", "LogRecord", "is_ready",
           "format_metric", "format_log_data_value", "to_host", "dist_info"]


class LoggerDestination(Callback):
    """Where metrics go. Receives raw values (floats or device scalars) and converts them with ``float()`` itself."""

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        pass

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        pass

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        pass

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False, step: int | None = None,
                   masks: Any = None, mask_class_labels: Any = None, use_table: bool = True) -> None:
        pass

    def log_table(self, columns: list, rows: list, name: str = "Table", step: int | None = None) -> None:
        pass


class FlushingDestination(LoggerDestination):
    """A destination that queues values (``PendingMetrics``) and writes them out at the host's sync points, where the
    host waits for the device anyway: the end of an epoch, of an evaluation and of fit."""

    def flush(self) -> None:
        raise NotImplementedError

    def epoch_end(self, state, logger) -> None:
        self.flush()

    def eval_end(self, state, logger) -> None:
        self.flush()

    def fit_end(self, state, logger) -> None:
        self.flush()


class Logger:
    """Fan-out facade. The trainer calls ``set_step`` once per batch so callers need not pass ``step``."""

    def __init__(self, destinations: Iterable[LoggerDestination] = ()):
        self.destinations = list(destinations)
        for d in self.destinations:
            if not isinstance(d, LoggerDestination):
                raise TypeError(f"Logger destinations must be LoggerDestination instances, got {type(d).__name__}.")
        self._step = 0

    @property
    def step(self) -> int:
        return self._step

    def set_step(self, step: int) -> None:
        self._step = int(step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        step = self._step if step is None else int(step)
        for d in self.destinations:
            d.log_metrics(metrics, step)

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        for d in self.destinations:
            d.log_hyperparameters(hparams)

    def log_images(self, images: Any, name: str = "Images", channels_last: bool = False, step: int | None = None,
                   masks: Any = None, mask_class_labels: Any = None, use_table: bool = True) -> None:
        """Composer's ``Logger.log_images``: to every destination that logs images (none of the built-in ones
        does yet; ``ImageVisualizer`` also writes its grids as PNGs into the run directory)."""
        for d in self.destinations:
            d.log_images(images, name=name, channels_last=channels_last, step=self.step if step is None else step,
                         masks=masks, mask_class_labels=mask_class_labels, use_table=use_table)

    def log_table(self, columns: list, rows: list, name: str = "Table", step: int | None = None) -> None:
        """Composer's ``Logger.log_table``: to every destination that logs tables."""
        for d in self.destinations:
            d.log_table(columns, rows, name=name, step=self.step if step is None else step)

    def upload_file(self, remote_file_name: str, file_path: Any, overwrite: bool = False) -> None:
        """Composer's ``Logger.upload_file``: hand ``file_path`` to every destination that uploads files (one with
        an ``upload_file`` method, such as a remote uploader); with none, nothing happens, as in Composer."""
        for d in self.destinations:
            upload = getattr(d, "upload_file", None)
            if callable(upload):
                upload(remote_file_name=remote_file_name, file_path=file_path, overwrite=overwrite)

    def log_traces(self, traces: Mapping[str, Any]) -> None:
        """Composer's algorithm traces (``algorithm_traces/<Name>/<event>``). Our algorithms are composed into the
        compiled step, so nothing in the library emits traces; the call exists for user code that does."""
        for d in self.destinations:
            d.log_traces(traces)


def in_jupyter_kernel() -> bool:
    """Whether this process is a running Jupyter kernel (not merely one that imported ipykernel)."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def is_ready(value: Any) -> bool:
    """True when ``float(value)`` will not wait: Python numbers always, jax arrays once computed."""
    check = getattr(value, "is_ready", None)
    if check is None:
        return True
    try:
        return bool(check())
    except Exception:  # deleted or donated buffer: let float() raise its own, clearer error
        return True


@dataclasses.dataclass
class LogRecord:
    step: int
    metrics: dict[str, float]
    context: dict[str, Any]


class PendingMetrics:
    """FIFO of logged metrics whose values may still be computing on the device.

    ``pop()`` releases entries in logging order once all their values are ready. Entries beyond ``max_pending`` are
    forced (``float()`` waits), which bounds both memory and how stale a destination can get; ``pop(force=True)``
    drains everything at sync points. ``context`` carries what must be captured at log time (epoch, wall time).
    """

    def __init__(self, max_pending: int = 16, convert: Callable[[Any], Any] = float):
        if max_pending < 0:
            raise ValueError(f"max_pending must be >= 0, got {max_pending}.")
        self.max_pending = max_pending
        self.convert = convert
        self._queue: collections.deque = collections.deque()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, step: int, metrics: Mapping[str, Any], **context: Any) -> None:
        self._queue.append((int(step), dict(metrics), context))

    def pop(self, force: bool = False) -> list[LogRecord]:
        out = []
        while self._queue:
            step, metrics, context = self._queue[0]
            if not (force or len(self._queue) > self.max_pending or all(map(is_ready, metrics.values()))):
                break
            self._queue.popleft()
            out.append(LogRecord(step, {k: self.convert(v) for k, v in metrics.items()}, context))
        return out


def format_metric(value: float) -> str:
    """Compact, fixed-ish width: 4 significant digits, scientific only for very small or large magnitudes."""
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.3e}"
    return f"{value:.4g}"


def to_host(value: Any) -> Any:
    """A logged value as Python data: a device or numpy scalar becomes an ``int``/``float`` (as ``tensor.item()``
    does in Composer), a larger array a numpy array; anything else is returned unchanged. Waits for device values,
    so call it on values that ``is_ready``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "is_ready") or isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return array.item() if array.size == 1 else array
    return value


def format_log_data_value(data: Any) -> str:
    """Composer's text for a logged value (its FileLogger and ConsoleLogger lines): strings quoted, ints as they
    are, floats with 4 decimals, one-element arrays as their element, mappings as ``{ "k": v, }``, other iterables
    as ``[a, b]``."""
    if data is None:
        return "None"
    if isinstance(data, str):
        return f'"{data}"'
    if isinstance(data, (bool, int)):
        return str(data)
    if isinstance(data, float):
        return f"{data:.4f}"
    if hasattr(data, "is_ready") or isinstance(data, (np.ndarray, np.generic)):
        array = np.asarray(data)
        if array.size == 1:
            return format_log_data_value(array.item())
        return f"Array of shape {array.shape}"
    if isinstance(data, Mapping):
        return "{ " + "".join(f'"{k}": {format_log_data_value(v)}, ' for k, v in data.items()) + "}"
    if isinstance(data, Iterable):
        return "[" + ", ".join(format_log_data_value(v) for v in data) + "]"
    return str(data)


def dist_info() -> dict[str, int]:
    """Composer's filename variables for this process. JAX runs one process per host, which drives all of that
    host's devices, so a process plays the part of one Composer rank and of one node."""
    import jax  # imported here: reading these does not need the caller to have touched jax yet

    rank, world = jax.process_index(), jax.process_count()
    return {"rank": rank, "local_rank": 0, "world_size": world, "local_world_size": 1, "node_rank": rank}
