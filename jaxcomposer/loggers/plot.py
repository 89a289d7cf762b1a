"""``PlotLogger``: a PNG at FIT_END with training loss and eval metrics against wall time since FIT_START.

It is its own destination: it keeps in memory only the series it draws (the train loss and ``metrics/*``). Figures are
built with ``matplotlib.figure.Figure`` and the Agg canvas directly, never ``pyplot``, so no global backend or rcParams
state is touched and no GUI window can open.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from jaxcomposer.loggers.logger import LoggerDestination, PendingMetrics

__all__ = ["PlotLogger"]

DEFAULT_FILENAME = "metrics.png"
LOSS_KEY = "loss/train/total"
EVAL_PREFIX = "metrics/"


class PlotLogger(LoggerDestination):
    """``path`` is the ``.png`` file or a directory that will hold ``metrics.png``."""

    def __init__(self, path: str | os.PathLike, loss_key: str = LOSS_KEY,
                 clock: Callable[[], float] = time.perf_counter, dpi: int = 100):
        path = Path(path)
        self.path = path if path.suffix.lower() == ".png" else path / DEFAULT_FILENAME
        self.loss_key = loss_key
        self.dpi = dpi
        self._clock = clock
        self._start = None
        self._pending = PendingMetrics(max_pending=64)
        self.series: dict[str, list[tuple[float, float]]] = {}  # name -> [(seconds since FIT_START, value)]

    def fit_start(self, state, logger) -> None:
        self._start = self._clock()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        kept = {k: v for k, v in metrics.items() if k == self.loss_key or k.startswith(EVAL_PREFIX)}
        if not kept:
            return
        start = self._start if self._start is not None else self._clock()
        self._pending.push(step, kept, t=self._clock() - start)
        self._absorb(self._pending.pop())

    def _absorb(self, records) -> None:
        for r in records:
            for name, value in r.metrics.items():
                self.series.setdefault(name, []).append((r.context["t"], value))

    def fit_end(self, state, logger) -> None:
        self._absorb(self._pending.pop(force=True))
        self.save(title=state.run_name)

    def save(self, title: str = "") -> Path:
        """Draw and write the PNG now; returns its path."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 4.2), dpi=self.dpi)
        FigureCanvasAgg(fig)
        ax_loss, ax_eval = fig.subplots(1, 2)
        loss = self.series.get(self.loss_key, [])
        if loss:
            ax_loss.plot([t for t, _ in loss], [v for _, v in loss], lw=1, color="tab:blue")
        ax_loss.set(title="training loss", xlabel="wall time since fit start (s)", ylabel=self.loss_key)
        evals = {k: v for k, v in self.series.items() if k.startswith(EVAL_PREFIX)}
        for name, points in sorted(evals.items()):
            ax_eval.plot([t for t, _ in points], [v for _, v in points], marker="o", ms=3,
                         label=name[len(EVAL_PREFIX):])
        ax_eval.set(title="eval metrics", xlabel="wall time since fit start (s)")
        if evals:
            ax_eval.legend(fontsize="small")
        for ax, has_data in ((ax_loss, bool(loss)), (ax_eval, bool(evals))):
            ax.grid(alpha=0.3)
            if not has_data:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(title or "run")
        fig.tight_layout()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(self.path, format="png")
        return self.path
