"""``TensorboardLogger``: scalars to ``events.out.tfevents.*`` through tensorboardX (no TensorFlow needed).

tensorboardX is imported only when the first value is written, as is the ``SummaryWriter``
itself, so constructing the logger neither needs the package nor creates ``log_dir``.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

from jaxcomposer.loggers.logger import FlushingDestination, PendingMetrics
from jaxcomposer.utils.extras import optional_import

__all__ = ["TensorboardLogger"]


def _summary_writer_cls():
    # tensorboardX imports torch, when it is installed, only to name a type in its hints: a slow start-up for a run
    # that logs floats. Unless torch is already loaded, it is hidden while tensorboardX loads (None in sys.modules
    # makes that import raise ImportError, which tensorboardX handles), then shown again.
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None
    try:
        return optional_import("tensorboardX", needed_by="TensorboardLogger", package="tensorboardX").SummaryWriter
    finally:
        if hide_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


class TensorboardLogger(FlushingDestination):
    def __init__(self, log_dir: str | os.PathLike, flush_secs: int = 30, max_pending: int = 16):
        self.log_dir = os.fspath(log_dir)
        self.flush_secs = flush_secs
        self._pending = PendingMetrics(max_pending)
        self._writer = None

    def _get_writer(self):
        if self._writer is None:
            self._writer = _summary_writer_cls()(logdir=self.log_dir, flush_secs=self.flush_secs)
        return self._writer

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        self._pending.push(step, metrics)
        self._write(self._pending.pop())

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        # Shown as a text summary: add_hparams needs final metrics and writes a separate run directory.
        if hparams:
            text = "\n".join(f"| {k} | {v} |" for k, v in sorted(hparams.items(), key=lambda kv: str(kv[0])))
            self._get_writer().add_text("hparams", "| name | value |\n|---|---|\n" + text, 0)

    def _write(self, records) -> None:
        for r in records:
            writer = self._get_writer()
            for name, value in r.metrics.items():
                writer.add_scalar(name, value, r.step)

    def flush(self) -> None:
        self._write(self._pending.pop(force=True))
        if self._writer is not None:
            self._writer.flush()

    def close(self, state, logger) -> None:
        self._write(self._pending.pop(force=True))
        if self._writer is not None:
            self._writer.close()
            self._writer = None
