"""Composer's events and the ``Callback`` protocol (``RunState``, what callbacks are handed, is in ``run_state.py``).

Events between steps are fired on the host in Composer's order. The events inside a train step (Composer's
AFTER_DATALOADER ... AFTER_TRAIN_BATCH) are compiled into the step: slots of a ``Method``, or a user's ``Algorithm``
traced by ``jaxcomposer/core/algorithm_engine.py``.
"""
from __future__ import annotations

import enum
from typing import Any



class Event(str, enum.Enum):
    """Composer's events, in the order a run fires them (``composer.core.Event``; the same values, and as in
    Composer each equals its value: ``Event.AFTER_DATALOADER == 'after_dataloader'``, the spelling
    Composer's docs use in ``match``).

    The Trainer fires the host events to callbacks and algorithms. The events inside a train step
    (:data:`IN_STEP_EVENTS`) reach a user's :class:`~jaxcomposer.core.algorithm.Algorithm` inside the compiled step
    (``jaxcomposer/core/algorithm_engine.py``); built-in methods hold them as slots."""

    INIT = "init"
    BEFORE_LOAD = "before_load"
    AFTER_LOAD = "after_load"
    FIT_START = "fit_start"
    ITERATION_START = "iteration_start"
    EPOCH_START = "epoch_start"
    BEFORE_DATALOADER = "before_dataloader"
    AFTER_DATALOADER = "after_dataloader"
    BATCH_START = "batch_start"
    BEFORE_TRAIN_BATCH = "before_train_batch"
    BEFORE_FORWARD = "before_forward"
    AFTER_FORWARD = "after_forward"
    BEFORE_LOSS = "before_loss"
    AFTER_LOSS = "after_loss"
    BEFORE_BACKWARD = "before_backward"
    AFTER_BACKWARD = "after_backward"
    AFTER_TRAIN_BATCH = "after_train_batch"
    BATCH_END = "batch_end"
    BATCH_CHECKPOINT = "batch_checkpoint"
    EPOCH_END = "epoch_end"
    EPOCH_CHECKPOINT = "epoch_checkpoint"
    ITERATION_END = "iteration_end"
    ITERATION_CHECKPOINT = "iteration_checkpoint"
    FIT_END = "fit_end"
    EVAL_BEFORE_ALL = "eval_before_all"
    EVAL_START = "eval_start"
    EVAL_BATCH_START = "eval_batch_start"
    EVAL_BEFORE_FORWARD = "eval_before_forward"
    EVAL_AFTER_FORWARD = "eval_after_forward"
    EVAL_BATCH_END = "eval_batch_end"
    EVAL_END = "eval_end"
    EVAL_AFTER_ALL = "eval_after_all"
    EVAL_STANDALONE_START = "eval_standalone_start"
    EVAL_STANDALONE_END = "eval_standalone_end"
    PREDICT_START = "predict_start"
    PREDICT_BATCH_START = "predict_batch_start"
    PREDICT_BEFORE_FORWARD = "predict_before_forward"
    PREDICT_AFTER_FORWARD = "predict_after_forward"
    PREDICT_BATCH_END = "predict_batch_end"
    PREDICT_END = "predict_end"

    @property
    def is_eval(self) -> bool:
        return self.value.startswith("eval")

    @property
    def is_predict(self) -> bool:
        return self.value.startswith("predict")

    @property
    def is_before_event(self) -> bool:
        return self.value.startswith("before") or self.value.endswith("_start")

    @property
    def is_after_event(self) -> bool:
        return self.value.startswith("after") or self.value.endswith("_end")

    @property
    def canonical_name(self) -> str:
        """The event's name without ``before_``/``after_``/``_start``/``_end`` (Composer's, for pairing events)."""
        name = self.value
        for affix in ("before_", "after_"):
            name = name.removeprefix(affix)
        for affix in ("_start", "_end"):
            name = name.removesuffix(affix)
        return name


# the events the Trainer fires to callbacks and loggers (and to users' algorithms on the host, but for those inside
# the step): Composer's, except the load events (a checkpoint loads inside Trainer.__init__, before INIT) and the
# ITERATION_* ones (one iteration per fit here)
CALLBACK_EVENTS = tuple(e for e in Event if e not in (Event.BEFORE_LOAD, Event.AFTER_LOAD, Event.ITERATION_START,
                                                      Event.ITERATION_END, Event.ITERATION_CHECKPOINT))
# the events inside one train step, in the order the step passes them (Composer: between BEFORE_TRAIN_BATCH and
# BATCH_END; the forward-to-backward ones once per microbatch there)
IN_STEP_EVENTS = (Event.AFTER_DATALOADER, Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS,
                  Event.AFTER_LOSS, Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD, Event.AFTER_TRAIN_BATCH)


class Callback:
    """Composer's callback protocol: one method per event, named like the event (``batch_end(state, logger)``).

    Override the events you need; ``run_event`` dispatches. ``close()`` runs once when the trainer closes.
    """

    def run_event(self, event: Event, state: RunState, logger: Any) -> None:
        handler = getattr(self, event.value, None)
        if handler is not None:
            handler(state, logger)

    def close(self, state: RunState, logger: Any) -> None:
        pass
