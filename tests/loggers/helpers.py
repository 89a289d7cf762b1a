"""A tiny fake training loop that fires host events in the trainer's order, for logger and callback tests."""
from __future__ import annotations

import datetime
from typing import Callable, Sequence

from jaxcomposer.core.events import Event

from jaxcomposer.core.run_state import RunPlan, RunState
from jaxcomposer.core.time import Time, Timestamp
from jaxcomposer.loggers.logger import Logger, LoggerDestination


class FakeClock:
    """A clock the test advances by hand; pass it as ``clock=`` to anything that measures time."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make_state(total_steps: int = 20, steps_per_epoch: int = 5, batch_size: int = 8, run_name: str = "test-run",
               learning_rate=None) -> RunState:
    return RunState(run_name=run_name, run_dir=None, plan=RunPlan(Time(total_steps, "ba"), total_steps, steps_per_epoch),
                    timestamp=Timestamp(), batch_size=batch_size, learning_rate=learning_rate)


def fire(event: Event, callbacks, state: RunState, logger: Logger) -> None:
    for cb in callbacks:
        cb.run_event(event, state, logger)


def fake_fit(callbacks: Sequence, state: RunState, losses: Sequence, *, eval_every: int | None = 5,
             eval_fn: Callable[[int], dict] | None = None, label: str = "eval", clock: FakeClock | None = None,
             batch_time: float = 0.1, eval_time: float = 0.0, close: bool = True) -> Logger:
    """Run ``len(losses)`` batches (fewer if a callback stops training) through every callback and destination.

    ``eval_fn(eval_index) -> {name: float}`` is called every ``eval_every`` batches (eval_index counts from 0).
    """
    logger = Logger([cb for cb in callbacks if isinstance(cb, LoggerDestination)])
    fire(Event.INIT, callbacks, state, logger)
    fire(Event.FIT_START, callbacks, state, logger)
    n_evals = 0
    for loss in losses:
        if state.timestamp.batch_in_epoch == 0:
            fire(Event.EPOCH_START, callbacks, state, logger)
        fire(Event.BATCH_START, callbacks, state, logger)
        if clock is not None:
            clock.advance(batch_time)
        state.timestamp = state.timestamp.to_next_batch(samples=state.batch_size,
                                                        duration=datetime.timedelta(seconds=batch_time))
        logger.set_step(state.timestamp.batch)
        state.batch_metrics = {"loss": loss}
        logger.log_metrics({"loss/train/total": loss})
        fire(Event.BATCH_END, callbacks, state, logger)
        if not state.stop_requested and eval_every and eval_fn and state.timestamp.batch % eval_every == 0:
            fire(Event.EVAL_START, callbacks, state, logger)
            for _ in range(2):
                fire(Event.EVAL_BATCH_END, callbacks, state, logger)
            if clock is not None:
                clock.advance(eval_time)
            metrics = dict(eval_fn(n_evals))
            n_evals += 1
            state.eval_metrics[label] = metrics
            logger.log_metrics({f"metrics/{label}/{k}": v for k, v in metrics.items()})
            fire(Event.EVAL_END, callbacks, state, logger)
        if state.timestamp.batch_in_epoch == state.steps_per_epoch:
            fire(Event.EPOCH_END, callbacks, state, logger)
            state.timestamp = state.timestamp.to_next_epoch()
        if state.stop_requested:
            break
    fire(Event.FIT_END, callbacks, state, logger)
    if close:
        for cb in callbacks:
            cb.close(state, logger)
    return logger


def accuracy_eval(values: Sequence[float], name: str = "accuracy") -> Callable[[int], dict]:
    return lambda i: {name: float(values[i]), "cross_entropy": 1.0 - float(values[i])}


class NotYet:
    """A device value stand-in whose computation has not finished."""

    def __init__(self, value):
        self.value, self.ready = value, False

    def is_ready(self):
        return self.ready

    def __array__(self, dtype=None, copy=None):
        import numpy as np
        return np.asarray(self.value, dtype=dtype)
