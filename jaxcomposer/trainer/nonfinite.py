"""Acting on the train steps' non-finite flags without waking the host on every step."""
from __future__ import annotations

import collections
from typing import Any

import jax
import numpy as np

from jaxcomposer.callbacks.monitors import NonFiniteLossError
from jaxcomposer.loggers.logger import is_ready

# Steps the host may queue past its oldest unread flag: reading every flag as soon as possible (even one step late)
# wakes the host on every step, time the host would rather spend queuing the next one.
MAX_UNCHECKED_STEPS = 8


class NonFiniteChecks:
    """The queue of ``(batch, step metrics)`` whose ``finite`` flag is not read yet, and the ``nonfinite`` policy
    (``'raise'``, or ``'skip'`` up to ``max_skips`` steps in a row). The step itself never applies a non-finite
    update, so the state is safe while a flag waits in the queue."""

    def __init__(self, policy: str, max_skips: int, logger: Any):
        self.policy, self.max_skips, self.logger = policy, max_skips, logger
        self.pending: collections.deque = collections.deque()
        self.skips_in_a_row = 0

    def add(self, batch: int, metrics: dict) -> None:
        """Queue a step's flag and take the flags already computed (``check(wait=False)``)."""
        self.pending.append((batch, metrics))
        self.check(wait=False)

    def check(self, wait: bool = True) -> None:
        """Acts on the queued flags, oldest first. ``wait=False`` (after each dispatch) takes the flags already
        computed, and waits only for those more than ``MAX_UNCHECKED_STEPS`` steps old; every sync point (save,
        eval, preemption, the end of fit) waits for all of them."""
        # Several processes must raise after the same step (their collectives wait for one another), so there each
        # flag is read exactly one step late, whenever it was computed
        solo = jax.process_count() == 1
        limit = MAX_UNCHECKED_STEPS if solo else 1
        pending = self.pending
        while pending:
            batch, metrics = pending[0]
            if not wait and len(pending) <= limit and not (solo and is_ready(metrics["finite"])):
                return
            pending.popleft()
            # np.asarray reads a jax.Array through its C++ buffer protocol; bool() walks JAX's Python conversion
            # path, host CPU that XLA's threads could use
            if bool(np.asarray(metrics["finite"])):
                self.skips_in_a_row = 0
                continue
            self._non_finite(batch, metrics)

    def _non_finite(self, batch: int, metrics: dict) -> None:
        loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
        what = f"loss is {loss}" if not np.isfinite(loss) else f"gradient norm is {grad_norm}"
        self.skips_in_a_row += 1
        self.logger.log_metrics({"nonfinite/skipped_in_a_row": self.skips_in_a_row}, batch)
        if self.policy == "raise" or self.skips_in_a_row > self.max_skips:
            why = "" if self.policy == "raise" else \
                f" ({self.skips_in_a_row} such steps in a row, more than nonfinite_max_skips={self.max_skips})"
            self.pending.clear()
            raise NonFiniteLossError(f"batch {batch}: the {what}{why}. The update was not applied and no state after "
                                     "it was saved. Lower the learning rate, clip gradients (GradientClipping), or "
                                     "pass nonfinite='skip' to step over rare bad batches.")
