"""``RunState``, the view of a run that callbacks, loggers and users' algorithms get (Composer's ``State``), and the
``RunPlan`` it reads its length from.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from jaxcomposer.core.time import Time, Timestamp


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
