"""Host events, the ``Callback`` protocol and ``RunState``, the view of a run that callbacks and loggers get.

Events between steps are fired on the host in Composer's order. The events inside a train step (Composer's
AFTER_DATALOADER ... AFTER_TRAIN_BATCH) are compiled into the step: slots of a ``Method``, or a user's ``Algorithm``
traced by ``jaxcomposer/core/algorithm_engine.py``.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from jaxcomposer.core.time import Time, Timestamp


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


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """How long the run is, decided once from the arguments and the train loader: the one place ``max_duration``
    lives. ``total_steps`` is ``max_duration`` in batches (what schedules and methods plan with);
    ``steps_per_epoch`` is None for loaders without ``len()``. ``Trainer.fit(duration=...)`` makes a new plan."""

    max_duration: Time | None = None
    total_steps: int = 1
    steps_per_epoch: int | None = None


class ReadsPlan:
    """The plan's fields as read-only attributes of an object holding ``plan`` (RunState, Trainer)."""

    plan: RunPlan

    @property
    def max_duration(self) -> Time | None:
        return self.plan.max_duration

    @property
    def total_steps(self) -> int:
        return self.plan.total_steps

    @property
    def steps_per_epoch(self) -> int | None:
        return self.plan.steps_per_epoch


@dataclasses.dataclass
class RunState(ReadsPlan):
    """What a host callback sees. The trainer owns and advances it; callbacks read it and may ask to stop.

    ``model`` is the module being trained, the object the user passed (after in-place surgery): the Trainer writes
    the current weights into it at the end of ``fit``, and before ``eval``, ``predict`` and ``save_checkpoint``.
    ``train_state`` is the live device pytree (read it, do not keep references across steps: its buffers are
    donated to the next step). ``batch_metrics`` holds this batch's step outputs (device scalars; ``float()``
    them only when needed, since that waits for the step). ``eval_metrics[label]`` holds the latest evaluation.
    """

    run_name: str
    run_dir: Any
    plan: RunPlan
    timestamp: Timestamp
    train_state: Any = None
    model: Any = None
    batch_metrics: dict = dataclasses.field(default_factory=dict)
    eval_metrics: dict = dataclasses.field(default_factory=dict)
    batch_size: int = 0
    learning_rate: Any = None
    stop_requested: bool = False
    stop_reason: str = ""
    # ---- Composer's State fields, set by the Trainer ----
    optimizers: list = dataclasses.field(default_factory=list)
    schedulers: list = dataclasses.field(default_factory=list)
    seed: int | None = None
    precision: str = "fp32"
    device: Any = None
    dataloader: Any = None
    batch: Any = None
    algorithms: list = dataclasses.field(default_factory=list)
    device_train_microbatch_size: Any = None
    eval_timestamp: Timestamp = dataclasses.field(default_factory=Timestamp)
    predict_timestamp: Timestamp = dataclasses.field(default_factory=Timestamp)
    predict_outputs: Any = None  # the batch's outputs while predict runs (state.outputs then)
    # the Trainer's: write the current weights into ``model`` (the user's module) and return it; costs a copy of the
    # weights from the device, so callbacks call it only when they hand the model to other code
    sync_model: Any = None
    train_metric_objects: Any = None  # the task's train metrics (compute_training_metrics), by name
    task: Any = None  # the Trainer's Task (model_inputs, the converted model), for callbacks that run the model
    train_metric_sums: Any = None  # their sums over the epoch so far (device arrays)
    profiler: Any = None  # the Trainer's Profiler (Composer's state.profiler), or None

    @property
    def rank_zero_seed(self) -> int | None:
        """Composer's name for the run's seed (every process trains with the same one here)."""
        return self.seed

    @property
    def loss(self) -> Any:
        """The last train batch's loss, a device scalar (``float(state.loss)`` waits for its step; nothing is read
        unless a callback asks)."""
        return self.batch_metrics.get("loss")

    @property
    def outputs(self) -> Any:
        """The current predict batch's outputs (at PREDICT_BATCH_END, as Composer's). During training and evaluation
        the outputs stay inside the compiled steps."""
        if self.predict_outputs is None:
            raise AttributeError("state.outputs: the model's outputs stay inside the compiled train and eval steps "
                                 "(keeping them would cost a device-to-host copy per batch); they are here at "
                                 "PREDICT_BATCH_END during trainer.predict; compute what you need during training "
                                 "with a metric (get_metrics)")
        return self.predict_outputs

    @property
    def train_metrics(self) -> dict:
        """The epoch's train metrics so far by name, each with ``.compute()`` (Composer's ``state.train_metrics``;
        reading them waits for the last step). Computed with ``Trainer(compute_training_metrics=True)`` only."""
        if self.train_metric_sums is None or self.train_metric_objects is None:
            raise AttributeError("state.train_metrics: none computed; pass compute_training_metrics=True to the "
                                 "Trainer, as in Composer (they are computed after the epoch's first batch)")
        return {name: MetricValue(float(m.compute(self.train_metric_sums[name])))
                for name, m in self.train_metric_objects.items()}

    @property
    def max_duration_in_batches(self) -> int:
        return self.plan.total_steps

    def stop_training(self, reason: str = "") -> None:
        self.stop_requested = True
        self.stop_reason = reason or self.stop_reason

    def elapsed_fraction(self) -> float:
        return min(1.0, self.timestamp.get(self.max_duration.unit).value / max(self.max_duration.value, 1e-12))

    # ---- what Composer's State offers its callbacks and function schedulers ----
    def get_elapsed_duration(self) -> Time | None:
        """The fraction of ``max_duration`` trained, as a ``dur`` Time (Composer's ``State.get_elapsed_duration``)."""
        return None if self.max_duration is None else Time(self.elapsed_fraction(), "dur")

    @property
    def dataloader_len(self) -> Time | None:
        """Batches per epoch as a ``ba`` Time (None for a loader without ``len()``), as Composer's State."""
        return None if self.steps_per_epoch is None else Time(self.steps_per_epoch, "ba")


class MetricValue(float):
    """A computed metric: a float that also answers Composer's ``metric.compute()`` (callbacks written for
    Composer read ``state.eval_metrics[label][name].compute()``; jaxcomposer's own read the float)."""

    def compute(self) -> float:
        return float(self)


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
