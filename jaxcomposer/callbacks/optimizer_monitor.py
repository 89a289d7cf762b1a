"""``OptimizerMonitor``: Composer's per-parameter gradient norms, computed inside the compiled step.

Composer reads ``p.grad`` of every parameter after the backward pass. Here gradients live inside the compiled
step, so the Trainer builds its step with per-parameter norms when this callback is present (and only then: a run
without it computes none), and the callback reads them from the step's outputs every ``batch_log_interval``
batches, the only time it waits for the device.
"""
from __future__ import annotations

import math

from jaxcomposer.core.events import Callback

__all__ = ["OptimizerMonitor"]


class OptimizerMonitor(Callback):
    """Composer's ``OptimizerMonitor(log_optimizer_metrics=True, batch_log_interval=10)``.

    Logs ``l2_norm/grad/<name>`` for every trained parameter (named as ``state.model.named_parameters()`` names
    it for a torch model, by its dotted path for an NNX one) and ``l2_norm/grad/global``, the norm over all of
    them, at every ``batch_log_interval``-th batch. With ``log_optimizer_metrics`` it also logs
    ``l2_norm/param/<name>`` (after the step) and ``l2_norm/update/<name>`` (the step's update, learning rate
    included); Composer logs those only for its own optimizers' ``report_per_parameter_metrics``, and its moment
    norms and cosines are not offered. The gradient is the one the optimizer received: after gradient accumulation
    and the methods' gradient edits (SAM; clipping happens in the optimizer chain after it).
    """

    reads_layer_norms = True  # the Trainer's cue to compute the norms in the step

    def __init__(self, log_optimizer_metrics: bool = True, batch_log_interval: int = 10):
        if not isinstance(batch_log_interval, int) or batch_log_interval < 1:
            raise ValueError(f"OptimizerMonitor: batch_log_interval must be a positive int, got {batch_log_interval!r}")
        self.log_optimizer_metrics = bool(log_optimizer_metrics)
        self.batch_log_interval = batch_log_interval

    def batch_end(self, state, logger) -> None:
        if int(state.timestamp.batch) % self.batch_log_interval != 0:
            return
        norms = state.batch_metrics.get("layer_norms")
        if norms is None:
            return  # a Trainer that did not build its step for this callback
        kinds = ("grad", "param", "update") if self.log_optimizer_metrics else ("grad",)
        metrics = {f"l2_norm/{kind}/{name}": float(value) for kind in kinds for name, value in norms[kind].items()}
        metrics["l2_norm/grad/global"] = math.sqrt(sum(float(v) ** 2 for v in norms["grad"].values()))
        logger.log_metrics(metrics)
