"""Preemption: SIGTERM/SIGINT become a stop asked between steps, so a step is never cut in half."""
from __future__ import annotations

import signal
import threading

import jax


class PreemptionGuard:
    """Turns SIGTERM/SIGINT into a stop asked between steps (the Trainer saves, then raises ``Preempted``).

    One process: a Python handler sets a flag. Several processes (``jax.distributed``): they must all stop after
    the same step, or the last checkpoint's collectives would wait for a process that left. JAX's preemption
    notifier records SIGTERM in each process, and ``reached_preemption_sync_point`` (called by every process at
    every step) agrees on the step to stop at, so no Python handler may replace its SIGTERM handler there; SIGINT
    keeps Python's default (KeyboardInterrupt, without a checkpoint). Outside the main thread (where Python cannot
    install handlers) it does nothing."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signal, self._previous = None, {}
        self._distributed = jax.process_count() > 1

    def _handle(self, signum, frame):
        self.signal = signum

    def poll(self, step: int) -> int | None:
        """The signal to stop for after ``step``, or None; every process calls it after every step."""
        if self._distributed:
            from jax.experimental import multihost_utils
            return signal.SIGTERM if multihost_utils.reached_preemption_sync_point(int(step)) else None
        return self.signal

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and not self._distributed:
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        return False
