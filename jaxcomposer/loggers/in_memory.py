"""``InMemoryLogger``: every logged value kept in Python lists, for notebooks and tests (Composer's InMemoryLogger)."""
from __future__ import annotations

import collections
import dataclasses
import datetime
from typing import Any, Mapping

import numpy as np

from jaxcomposer.core.time import Timestamp
from jaxcomposer.loggers.logger import LoggerDestination, is_ready, to_host

__all__ = ["InMemoryLogger"]

# get_timeseries's keys besides the metric: every Timestamp field, as Composer's (wall-clock ones in seconds)
_TIMESTAMP_FIELDS = tuple(f.name for f in dataclasses.fields(Timestamp))


class InMemoryLogger(LoggerDestination):
    """Composer's attributes:

    - ``data[name]``: list of ``(Timestamp, value)``, the run's timestamp at the time of the log call;
    - ``most_recent_values[name]`` / ``most_recent_timestamps[name]``: the last value and its timestamp;
    - ``hyperparameters``: every ``log_hyperparameters`` call merged (``hparams`` is the same dict);
    - ``get_timeseries(name)``: the series as numpy arrays, one per Timestamp field.

    A device scalar (the step's loss) is stored as a Python number, converted once computed: reading any attribute
    converts what is still pending, so logging every batch never waits for the step. Before INIT (no run state
    yet) the timestamp is ``Timestamp(batch=step)``.
    """

    def __init__(self, max_pending: int = 16) -> None:
        self._data: dict[str, list[tuple[Timestamp, Any]]] = {}
        self._pending: collections.deque = collections.deque()  # (series, index) of values not yet converted
        self.max_pending = max_pending
        self.state = None
        self.hyperparameters: dict[str, Any] = {}
        self.tables: dict[str, str] = {}

    @property
    def hparams(self) -> dict[str, Any]:
        return self.hyperparameters

    def init(self, state, logger) -> None:
        self.state = state

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self.hyperparameters.update(hparams)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        timestamp = self.state.timestamp if self.state is not None else Timestamp(batch=step)
        for name, value in metrics.items():
            series = self._data.setdefault(name, [])
            if hasattr(value, "is_ready"):
                self._pending.append((series, len(series)))
            else:
                value = to_host(value)
            series.append((timestamp, value))
        self._convert(force=False)

    def _convert(self, force: bool) -> None:
        while self._pending:
            series, i = self._pending[0]
            timestamp, value = series[i]
            if not (force or len(self._pending) > self.max_pending or is_ready(value)):
                return
            self._pending.popleft()
            series[i] = (timestamp, to_host(value))

    @property
    def data(self) -> dict[str, list[tuple[Timestamp, Any]]]:
        self._convert(force=True)
        return self._data

    @property
    def most_recent_values(self) -> dict[str, Any]:
        return {name: series[-1][1] for name, series in self.data.items() if series}

    @property
    def most_recent_timestamps(self) -> dict[str, Timestamp]:
        return {name: series[-1][0] for name, series in self.data.items() if series}

    def get_timeseries(self, metric: str) -> dict[str, np.ndarray]:
        """``{metric: values, 'iteration': ..., 'epoch': ..., 'batch': ..., 'sample': ..., 'token': ...,
        'batch_in_epoch': ..., ..., 'total_wct': seconds, ...}``, each a numpy array aligned with the values, as
        Composer's. For example ``plt.plot(ts['batch'], ts['metrics/eval/MulticlassAccuracy'])``."""
        if metric not in self.data:
            raise ValueError(f"Invalid value for argument `metric`: {metric}. Requested metric is not present in "
                             f"self.data.keys() ({sorted(self.data)}).")
        out: dict[str, list] = {metric: []}
        for timestamp, value in self.data[metric]:
            out[metric].append(value)
            for name in _TIMESTAMP_FIELDS:
                field = getattr(timestamp, name)
                out.setdefault(name, []).append(field.total_seconds() if isinstance(field, datetime.timedelta)
                                                else int(field))
        return {name: np.array(values) for name, values in out.items()}

    def fit_end(self, state, logger) -> None:
        self._convert(force=True)
