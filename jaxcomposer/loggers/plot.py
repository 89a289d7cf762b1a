"""``PlotLogger``: a PNG at FIT_END with training loss and eval metrics against batches (samples on the top axis).

With ``history`` (the run's ``metrics.jsonl``), a run continued by autoresume plots its earlier part too: the
records up to the batch it resumed from.

It is its own destination: it keeps in memory only the series it draws (the train loss and ``metrics/*``). Figures are
built with ``matplotlib.figure.Figure`` and the Agg canvas directly, never ``pyplot``, so no global backend or rcParams
state is touched and no GUI window can open.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from jaxcomposer.loggers.jsonl import read_jsonl
from jaxcomposer.loggers.logger import LoggerDestination, PendingMetrics, in_jupyter_kernel
from jaxcomposer.utils.extras import optional_import

__all__ = ["PlotLogger", "LivePlotLogger"]

DEFAULT_FILENAME = "metrics.png"
LOSS_KEY = "loss/train/total"
EVAL_PREFIX = "metrics/"


class PlotLogger(LoggerDestination):
    """``path`` is the ``.png`` file or a directory that will hold ``metrics.png``."""

    def __init__(self, path: str | os.PathLike, loss_key: str = LOSS_KEY, dpi: int = 100,
                 history: str | os.PathLike | None = None):
        path = Path(path)
        self.path = path if path.suffix.lower() == ".png" else path / DEFAULT_FILENAME
        self.loss_key = loss_key
        self.dpi = dpi
        self.history = Path(history) if history is not None else None
        self._pending = PendingMetrics(max_pending=64)
        self.series: dict[str, list[tuple[int, float]]] = {}  # name -> [(batch, value)]
        self.samples_per_batch: int | None = None

    def fit_start(self, state, logger) -> None:
        if self.history is not None and self.history.is_file() and not self.series:
            resumed_at = int(state.timestamp.batch)
            for record in read_jsonl(self.history):  # an earlier part of this run (autoresume)
                step = record.get("step")
                if step is not None and step <= resumed_at:
                    self._keep(step, record.get("metrics", {}))

    def batch_end(self, state, logger) -> None:
        self.samples_per_batch = self.samples_per_batch or int(state.batch_size) or None

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        kept = {k: v for k, v in metrics.items() if k == self.loss_key or k.startswith(EVAL_PREFIX)}
        if not kept:
            return
        self._pending.push(step, kept)
        self._absorb(self._pending.pop())

    def _keep(self, step: int, metrics: Mapping[str, Any]) -> None:
        for name, value in metrics.items():
            if name == self.loss_key or name.startswith(EVAL_PREFIX):
                self.series.setdefault(name, []).append((int(step), float(value)))

    def _absorb(self, records) -> None:
        for r in records:
            self._keep(r.step, r.metrics)

    def fit_end(self, state, logger) -> None:
        self._absorb(self._pending.pop(force=True))
        self.save(title=state.run_name)

    def save(self, title: str = "") -> Path:
        """Draw and write the PNG now; returns its path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(self.render_png(title))
        return self.path

    def render_png(self, title: str = "") -> bytes:
        """The plot of the series so far, as PNG bytes."""
        import io

        figure = optional_import("matplotlib.figure", needed_by=type(self).__name__, package="matplotlib",
                                 extra="plots")
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        fig = figure.Figure(figsize=(11, 4.2), dpi=self.dpi)
        FigureCanvasAgg(fig)
        ax_loss, ax_eval = fig.subplots(1, 2)
        loss = self.series.get(self.loss_key, [])
        if loss:
            ax_loss.plot([t for t, _ in loss], [v for _, v in loss], lw=1, color="tab:blue")
        ax_loss.set(title="training loss", xlabel="batch", ylabel=self.loss_key)
        evals = {k: v for k, v in self.series.items() if k.startswith(EVAL_PREFIX)}
        for name, points in sorted(evals.items()):
            ax_eval.plot([t for t, _ in points], [v for _, v in points], marker="o", ms=3,
                         label=name[len(EVAL_PREFIX):])
        ax_eval.set(title="eval metrics", xlabel="batch")
        if self.samples_per_batch:
            n = self.samples_per_batch
            for ax in (ax_loss, ax_eval):
                ax.secondary_xaxis("top", functions=(lambda b: b * n, lambda s: s / n)).set_xlabel("samples")
        if evals:
            ax_eval.legend(fontsize="small")
        for ax, has_data in ((ax_loss, bool(loss)), (ax_eval, bool(evals))):
            ax.grid(alpha=0.3)
            if not has_data:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        fig.suptitle(title or "run")
        fig.tight_layout()
        out = io.BytesIO()
        fig.savefig(out, format="png")
        return out.getvalue()


class LivePlotLogger(PlotLogger):
    """The same plot, shown in a Jupyter notebook and redrawn in place at each evaluation's end and at the end of
    ``fit`` (one output, updated; a saved notebook keeps the last figure). With ``path`` the final PNG is written
    there too, as ``PlotLogger`` does; ``renders`` counts the redraws. Outside a Jupyter kernel it only writes the
    file."""

    def __init__(self, path: str | os.PathLike | None = None, loss_key: str = LOSS_KEY, dpi: int = 72,
                 history: str | os.PathLike | None = None):
        super().__init__(path if path is not None else DEFAULT_FILENAME, loss_key=loss_key, dpi=dpi,
                         history=history)
        self.writes_file = path is not None
        self.renders = 0
        self._handle = None

    def _redraw(self, title: str) -> None:
        if not in_jupyter_kernel():  # nowhere to show it: the file (with a path) is written at the end
            return
        from IPython.display import Image, display
        image = Image(data=self.render_png(title), format="png")
        if self._handle is None:
            self._handle = display(image, display_id=True)
        else:
            self._handle.update(image)
        self.renders += 1

    def eval_end(self, state, logger) -> None:
        self._absorb(self._pending.pop(force=True))  # (the host waited for the device at the evaluation anyway)
        self._redraw(state.run_name)

    def fit_end(self, state, logger) -> None:
        self._absorb(self._pending.pop(force=True))
        self._redraw(state.run_name)
        if self.writes_file:
            self.save(title=state.run_name)
