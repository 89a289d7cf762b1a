"""``InMemoryLogger``: every logged value kept in Python lists, for notebooks and tests (Composer's InMemoryLogger)."""
from __future__ import annotations

from typing import Any, Mapping

from jaxcomposer.loggers.logger import LoggerDestination, PendingMetrics

__all__ = ["InMemoryLogger"]


class InMemoryLogger(LoggerDestination):
    """``data[name]`` is a list of ``(step, float)``; ``most_recent_values[name]`` the last float; ``hparams`` merged.

    Values are converted lazily (when ready, or when ``data`` is read) so that logging a device loss every batch does
    not wait for the step.
    """

    def __init__(self):
        self._data: dict[str, list[tuple[int, float]]] = {}
        self._pending = PendingMetrics()
        self.hparams: dict[str, Any] = {}

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self._pending.push(step, metrics)
        self._absorb(self._pending.pop())

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self.hparams.update(hparams)

    def _absorb(self, records) -> None:
        for record in records:
            for name, value in record.metrics.items():
                self._data.setdefault(name, []).append((record.step, value))

    @property
    def data(self) -> dict[str, list[tuple[int, float]]]:
        self._absorb(self._pending.pop(force=True))
        return self._data

    @property
    def most_recent_values(self) -> dict[str, float]:
        return {name: series[-1][1] for name, series in self.data.items() if series}

    def fit_end(self, state, logger) -> None:
        self._absorb(self._pending.pop(force=True))
