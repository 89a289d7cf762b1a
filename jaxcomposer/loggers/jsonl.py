"""``JSONLLogger``: the machine-readable local log, one JSON object per log call, append-only.

Line format: ``{"step": int, "epoch": int, "wall_time_s": float, "metrics": {name: float}}``; hyperparameters as
``{"hparams": {...}}``. Append-only so a resumed run continues the same file (readers de-duplicate by step, the last
line for a step wins). Nothing touches the disk before the first write, so a run that fails validation leaves no
empty directories behind. Device values are written once computed (see ``PendingMetrics``), in logging order;
epoch and wall time are captured at log time, from the state seen at the last event.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

from jaxcomposer.loggers.logger import FlushingDestination, PendingMetrics

__all__ = ["JSONLLogger", "read_jsonl"]

DEFAULT_FILENAME = "metrics.jsonl"


def _json_safe(value: Any) -> Any:
    """JSON has no NaN/inf; write them as strings so the file stays valid JSON for strict readers."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        return float(value)  # numpy / jax scalars
    except (TypeError, ValueError):
        return str(value)


class JSONLLogger(FlushingDestination):
    """``path`` is either the ``.jsonl`` file or a directory that will hold ``metrics.jsonl``."""

    def __init__(self, path: str | os.PathLike, max_pending: int = 16):
        path = Path(path)
        self.path = path if path.suffix == ".jsonl" else path / DEFAULT_FILENAME
        self._pending = PendingMetrics(max_pending)
        self._state = None
        self._file = None

    # Events: remember the state; drain at points where the host waits for the device anyway.
    def run_event(self, event, state, logger) -> None:
        self._state = state
        super().run_event(event, state, logger)

    def close(self, state, logger) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None

    # Logging.
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        epoch, wall = 0, 0.0
        if self._state is not None:
            epoch = int(self._state.timestamp.epoch)
            wall = self._state.timestamp.total_wct.total_seconds()
        self._pending.push(step, metrics, epoch=epoch, wall_time_s=wall)
        self._write_records(self._pending.pop())

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self.flush()  # keep file order equal to call order
        self._write_line({"hparams": _json_safe(dict(hparams))})

    def flush(self) -> None:
        """Write every queued record, waiting for device values if needed."""
        self._write_records(self._pending.pop(force=True))

    def _write_records(self, records) -> None:
        for r in records:
            self._write_line({"step": r.step, "epoch": r.context["epoch"], "wall_time_s": r.context["wall_time_s"],
                              "metrics": _json_safe(r.metrics)})

    def _write_line(self, obj: dict) -> None:
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(obj) + "\n")
        self._file.flush()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a metrics.jsonl (``path`` may be the file or its directory), in file order."""
    path = Path(path)
    if path.is_dir():
        path = path / DEFAULT_FILENAME
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
