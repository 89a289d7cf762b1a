"""``Trainer``: Composer's keyword names around one jitted pure step. Read it top to bottom:
``__init__`` validates everything (before any compile or file write), builds the optimizer chain and the state;
``fit`` is the loop of host events around ``train_step``; ``eval`` and ``predict`` reuse the same weights logic.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import random
import shutil
import sys
import tempfile
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
import optax

from jaxcomposer.core.evaluator import as_evaluators, check_metric_names
from jaxcomposer.core.events import IN_STEP_EVENTS, Callback, Event
from jaxcomposer.core.run_state import ReadsPlan, RunPlan, RunState
from jaxcomposer.core import adapters, allocator
from jaxcomposer.core.collector import collector_paused
from jaxcomposer.core.algorithm import is_algorithm
from jaxcomposer.core.algorithm_engine import NAME as ENGINE_NAME, AlgorithmEngine
from jaxcomposer.core.method import Method, ModelView, RunInfo, StepCtx, compose
from jaxcomposer.core.model import Task, param_use_order
from jaxcomposer.core.time import Time, TimeUnit, Timestamp
from jaxcomposer.data import data_spec
from jaxcomposer.data.prefetch import prefetch_to_device
from jaxcomposer import options, parallel
from jaxcomposer.errors import ConfigurationError, Preempted
from jaxcomposer.metrics.base import check_metrics, merge
from jaxcomposer.loggers import (ConsoleLogger, JSONLLogger, Logger, LoggerDestination, PlotLogger,
                                 ProgressBarLogger, RemoteUploaderDownloader, TensorboardLogger)
from jaxcomposer.loggers.remote_uploader_downloader import FolderUploader
from jaxcomposer.optim import DecoupledSGDW, call_function_scheduler, compose_schedules
from jaxcomposer.profiler import Profiler
from jaxcomposer.trainer import checkpoint, microbatching, multi_step, plan
from jaxcomposer.trainer import step as steps
from jaxcomposer.trainer.batches import as_batch, as_loader, rows_in
from jaxcomposer.trainer.evaluation import EvaluationAndPrediction
from jaxcomposer.trainer.lr_table import HostLRTable
from jaxcomposer.trainer.nonfinite import NonFiniteChecks
from jaxcomposer.trainer.preemption import PreemptionGuard
from jaxcomposer.utils import reproducibility
from jaxcomposer.utils.extras import how_to_install, is_installed
from jaxcomposer.utils.object_store import RemoteFolder, is_uri, staging_root

_MICROBATCH_EVENTS = (Event.BEFORE_FORWARD, Event.AFTER_FORWARD, Event.BEFORE_LOSS, Event.AFTER_LOSS,
                      Event.BEFORE_BACKWARD, Event.AFTER_BACKWARD)


class Trainer(EvaluationAndPrediction, ReadsPlan):
    """Composer's ``Trainer``: the same keyword names, around one jitted pure step (docs/design.md).

    Every argument is validated in ``__init__``, before anything is compiled or written; bad ones raise
    :class:`~jaxcomposer.errors.ConfigurationError` naming each. The arguments are declared, with their types,
    defaults and documentation, in :mod:`jaxcomposer.options`; ``help(Trainer)`` lists them below.
    """

    def __init__(self, *, model: Task, train_dataloader: Iterable | None = None,
                 eval_dataloader: Iterable | None = None, max_duration: int | str | Time | None = None,
                 optimizers: optax.GradientTransformation | None = None, schedulers: Any = None,
                 step_schedulers_every_batch: bool | None = None, compute_training_metrics: bool = False,
                 scale_schedule_ratio: float = 1.0, algorithms: Sequence | None = None,
                 algorithm_passes: Any = None,
                 callbacks: Callback | Sequence[Callback] | None = None,
                 loggers: LoggerDestination | Sequence[LoggerDestination] | None = None,
                 eval_interval: int | str | Time = 1, eval_subset_num_batches: int = -1,
                 train_subset_num_batches: int = -1, seed: int | None = None, precision: str | None = None,
                 device_train_microbatch_size: int | None = None, run_name: str | None = None,
                 run_dir: str | Path | None = None, progress_bar: bool = True, log_to_console: bool = False,
                 console_log_interval: int | str | Time = "1ba", console_stream: str = "stderr",
                 load_path: str | Path | None = None, save_folder: str | Path | None = None,
                 save_interval: int | str | Time | Callable = "1ep", save_num_checkpoints_to_keep: int = -1,
                 save_filename: str = "ep{epoch}-ba{batch}-rank{rank}.pt",
                 save_latest_filename: str | None = "latest-rank{rank}.pt",
                 save_overwrite: bool = False, save_weights_only: bool = False, load_weights_only: bool = False,
                 load_ignore_keys: Sequence[str] = (), autoresume: bool = False, nonfinite: str = "raise",
                 nonfinite_max_skips: int = 10, devices: Sequence | None = None,
                 parallelism_config: dict | None = None, fsdp_config: dict | None = None,
                 device_memory_bytes: int | None = None, steps_per_execution: int = 1, device: Any = None,
                 profiler: Profiler | None = None):
        # ---- validate (nothing compiled or written yet) ----
        a = options.validate_trainer_args(locals())  # every plain-valued argument, against the one option table
        if profiler is not None and not isinstance(profiler, Profiler):
            raise ConfigurationError(f"profiler: got {type(profiler).__name__}, expected a jaxcomposer.profiler."
                                     "Profiler(schedule=cyclic_schedule(...), trace_handlers=[JSONTraceHandler(...)])")
        self.profiler = profiler
        if adapters.is_foreign_model(model):
            # a torch ComposerModel (forward(batch) + its own loss) is its own task; a bare torch module is a
            # classifier, as Composer's ComposerClassifier(module)
            from jaxcomposer.models.tasks import ComposerClassifier
            model = adapters.as_task(model) or ComposerClassifier.for_module(model)
        if not isinstance(model, Task):
            raise ConfigurationError(
                f"model: expected a jaxcomposer task such as ComposerClassifier(module) or ComposerCausalLM(module), "
                f"got {type(model).__name__}. Wrap your flax.nnx module: ComposerClassifier(module, num_classes=10).")
        # a DataSpec (Composer's): its transforms run inside the compiled steps, its counters on the host;
        # train_data_spec / eval_data_spec are the DataSpecs the loaders came in (None for a plain loader)
        user_train_dataloader = self._user_train_loader = train_dataloader
        train_dataloader, self.train_data_spec = data_spec.unwrap(train_dataloader)
        train_dataloader = as_loader(train_dataloader, "train_dataloader")
        self.eval_interval = options.parse_interval(a.eval_interval, "eval_interval")
        self._eval_sets = [self._eval_set(ev) for ev in as_evaluators(eval_dataloader)]
        eval_dataloader, self.eval_data_spec = \
            (self._eval_sets[0].loader, self._eval_sets[0].spec) if self._eval_sets else (None, None)
        self.precision = a.precision or "fp32"
        user_schedulers = [] if schedulers is None else list(schedulers) \
            if isinstance(schedulers, (list, tuple)) else [schedulers]
        schedulers, foreign = _split_schedulers(user_schedulers)  # (torch ones: checked once the optimizer is)
        if a.scale_schedule_ratio != 1.0 and not schedulers:
            raise ConfigurationError("scale_schedule_ratio: set without schedulers; it scales the LR schedule "
                                     "(as in Composer), so pass schedulers=... too.")
        max_duration = None if a.max_duration is None else \
            plan.scale_duration(options.parse_duration(a.max_duration, "max_duration"), a.scale_schedule_ratio)
        user_algorithms = list(algorithms) if isinstance(algorithms, (list, tuple)) else \
            [] if algorithms is None else [algorithms]
        self.engine, algorithms = _algorithm_engine(user_algorithms, algorithm_passes, a.steps_per_execution)
        self.composed = compose(algorithms)  # raises on method conflicts
        self.seed = a.seed if a.seed is not None else random.randrange(2**31)
        # as Composer's Trainer: the user's own draws (a torch DataLoader's shuffle) repeat with the seed
        reproducibility.seed_imported(self.seed)
        self.run_name = a.run_name or datetime.datetime.now().strftime("run-%Y%m%d-%H%M%S")
        # an object-store run_dir: the files are written to a local staging folder and uploaded from there
        self.run_dir_uri = a.run_dir if is_uri(a.run_dir) else None
        self.run_dir = None if a.run_dir is None else Path(a.run_dir).absolute() if self.run_dir_uri is None else \
            Path(tempfile.mkdtemp(prefix=f"{self.run_name}-", dir=staging_root()))
        if self.run_dir_uri is not None:  # (the staged copy goes at close(), or when the interpreter exits)
            weakref.finalize(self, shutil.rmtree, self.run_dir, True)
            if a.autoresume:  # the run goes on: its files too (metrics.jsonl appends)
                RemoteFolder(self.run_dir_uri, "run_dir").get_folder(self.run_dir)
        devices = parallel.devices_for(device, devices)
        self.parallelism = parallel.parse_parallelism(a.parallelism_config, a.fsdp_config, len(devices),
                                                      num_processes=jax.process_count())
        self.mesh = parallel.make_mesh(self.parallelism, devices)
        self.num_devices = self.parallelism.batch_ways  # the batch is split this many ways
        if devices[0].platform == "cpu" and (why := allocator.slow_allocator_warning()):
            warnings.warn(why, RuntimeWarning, stacklevel=2)

        self.save_interval = a.save_interval if callable(a.save_interval) else \
            options.parse_interval(a.save_interval, "save_interval")
        self.store, resume_step = checkpoint.store_for_run(a, self.run_name)
        if a.load_ignore_keys and a.load_path is None:
            raise ConfigurationError(f"load_ignore_keys: {a.load_ignore_keys} given without load_path")
        load_dir = None if a.load_path is None or resume_step is not None else \
            checkpoint.resolve_load_path(a.load_path)
        self.train_dataloader, self.eval_dataloader = train_dataloader, eval_dataloader
        self.train_subset_num_batches = a.train_subset_num_batches
        self.eval_subset_num_batches = a.eval_subset_num_batches
        self.microbatch_size = a.device_train_microbatch_size  # 'auto' is resolved at the first batch
        self._conv_choices_said, self._conv_mark = False, None  # conv_impl="auto": said after the first step
        self._last_eval_batch = -1  # the batch the last evaluation in fit ran after
        self.device_memory_bytes = a.device_memory_bytes
        self.scale_schedule_ratio = a.scale_schedule_ratio

        self._attach_optimizer(optimizers, schedulers, foreign, model.user_model, a)
        self._host_lr = 1.0
        self.task = model  # (the plan may count tokens with it; surgery below replaces it)
        self._replan(max_duration)
        # surgery first: on a torch module it runs before export (and a torch optimizer follows it to the new layers)
        surgery = getattr(self._foreign_optimizer, "surgery", None)
        if surgery is not None:
            surgery.before(model.user_model)
        self.task = self.composed.apply_model(model, StepCtx(step=0, run=self.run_info))
        if surgery is not None:
            surgery.after(self.task.user_model)
        self._check_task_metrics(a.compute_training_metrics)
        self._bind_task()
        self.param_order = functools.cache(  # traced once, the first time a method asks (LayerFreezing)
            lambda: param_use_order(self.task.forward, self.task.params, self.task.state,
                                    self._model_batch(self._example_batch())))
        self.model_view = ModelView(param_order=self.param_order,
                                    param_layout="torch" if self.task.pure.bridged is not None else "flax")

        self._attach_callbacks(callbacks, loggers, a, profiler)

        state, timestamp = self._starting_state(a, resume_step, load_dir)
        self._last_saved = timestamp.batch if resume_step is not None else None
        self.state = RunState(run_name=self.run_name, run_dir=self.run_dir, plan=self.plan, timestamp=timestamp,
                              train_state=state, model=self.task.user_model, learning_rate=self._lr_at,
                              optimizers=[self.user_optimizer], schedulers=user_schedulers, seed=self.seed,
                              precision=self.precision, device=devices[0], dataloader=user_train_dataloader,
                              algorithms=user_algorithms,
                              device_train_microbatch_size=a.device_train_microbatch_size,
                              sync_model=self._synced_model, profiler=profiler, task=self.task,
                              train_metric_objects=self._train_metrics or None)
        self._synced_params = None if (resume_step is not None or load_dir is not None) else state.params
        self._sync_model()  # a loaded checkpoint's weights are in the user's module from the start
        self._fire(Event.INIT)

    def _attach_optimizer(self, optimizers: Any, schedulers: list, foreign: list, user_model: Any, a: Any) -> None:
        """The optimizer (Composer's default, an optax one, or a torch one translated) and the schedulers: ours
        compile into the step, the others are asked on the host (``foreign``: the torch ones, by their index)."""
        if isinstance(optimizers, (list, tuple)) and not hasattr(optimizers, "update"):  # Composer: [opt]
            if len(optimizers) != 1:
                raise ConfigurationError(f"optimizers: exactly one optimizer is supported (as in Composer), got "
                                         f"{len(optimizers)}; combine parameter groups with optax.multi_transform")
            optimizers = optimizers[0]
        self.user_optimizer = optimizers if optimizers is not None else DecoupledSGDW(lr=0.1)  # Composer's default
        # a torch optimizer (built on model.parameters()) is translated to torch's own update rule; it is checked
        # now, bound to the converted model's params after export, and holds the run's state after fit
        self.optimizer, self._foreign_optimizer = _translate_optimizer(self.user_optimizer, user_model)
        self.base_lr = getattr(self.optimizer, "lr", None)
        # ours compile into the step; Composer-style functions of the run state are called on the host each batch;
        # torch LR schedulers step on the host (each epoch, or each batch) and their LR multiplies the step's
        self.schedulers = [sch for sch in schedulers if hasattr(sch, "schedule")]
        self.host_schedulers = [sch for sch in schedulers if not hasattr(sch, "schedule")]
        self.torch_schedulers = [adapter.to_scheduler(sched, self.user_optimizer, f"schedulers[{i}]")
                                 for i, sched, adapter in foreign]
        for (i, sched, _), host in zip(foreign, self.torch_schedulers):
            if host is None:
                raise ConfigurationError(f"schedulers[{i}]: got {type(sched).__name__}, expected a scheduler from "
                                         "jaxcomposer.optim, a torch LR scheduler or a Composer-style function")
        self.step_schedulers_every_batch = bool(a.step_schedulers_every_batch)
        self.steps_per_execution = a.steps_per_execution
        if self.steps_per_execution > 1 and (self.host_schedulers or self.torch_schedulers):
            raise ConfigurationError(
                f"steps_per_execution: {self.steps_per_execution} trains several batches per call, but "
                f"{len(self.host_schedulers) + len(self.torch_schedulers)} scheduler(s) are Composer-style functions "
                "or torch schedulers, which the host asks before every batch; use steps_per_execution=1, or "
                "jaxcomposer.optim's schedulers (compiled into the step).")

    def _bind_task(self) -> None:
        """The task bound to the loader's first batch (a torch module is exported with it), the users' algorithms
        told how to capture torch code and what structure the loader's batches have, a torch optimizer bound to the
        converted model's parameters."""
        raw = None  # the loader's first batch, read at most once here (a torch loader's iterator draws a seed)
        if not self.task.is_bound:
            raw = self._first_raw_batch()
            if hasattr(self.task, "note_raw_batch"):  # a task that hands the loader's own structure to its model
                self.task.note_raw_batch(raw)
            self.task.bind(self._model_batch(as_batch(raw)))
        if self.engine is not None and self.task.pure.bridged is not None:  # torch code in an apply: torch.export
            capture = adapters.model_adapter(self.task.source).functional.get("capture_algorithm")
            names = {key: self.task.user_param_name(key) for key in self.task.params}
            self.engine.capture = None if capture is None else functools.partial(
                capture, module=self.task.user_model, user_names=names)
        if self.engine is not None:  # an in-step apply sees state.batch in the loader's structure
            raw = self._first_raw_batch() if raw is None else raw
            pairs = getattr(self.train_dataloader, "yields_pairs", None)  # a converted loader says what it read
            self.engine.pair_batches = isinstance(raw, (tuple, list)) if pairs is None else pairs
        if self._foreign_optimizer is not None:  # its params are the converted model's, named as it names them
            self.optimizer = self._foreign_optimizer.bind(self.task.pure.bridged)
            self.build_tx = steps.make_base_tx(self.optimizer, self._alpha, self.composed)

    def _check_task_metrics(self, compute_training_metrics: bool) -> None:
        """The task's eval (and, with Composer's ``compute_training_metrics``, train) metrics, and the evaluators'
        metric names, checked before anything compiles."""
        # checked now, before anything compiles; a task whose metrics live on the host (a torch ComposerModel's
        # torchmetrics) has none here
        self._eval_metrics = {} if hasattr(self.task, "host_metrics") else check_metrics(
            self.task.get_metrics(is_train=False), f"{type(self.task).__name__}.get_metrics()")
        # Composer's compute_training_metrics: the task's train metrics, summed in the step, computed per epoch
        self._train_metrics = {}
        if compute_training_metrics:
            if hasattr(self.task, "host_metrics"):
                raise ConfigurationError(
                    f"compute_training_metrics: {type(self.task.user_model).__name__}'s metrics are torchmetrics "
                    "objects, updated on the host, and the train step's outputs stay on the device; evaluate on "
                    "training data instead (eval_dataloader=[Evaluator(label='train', dataloader=...), ...]), or use "
                    "jaxcomposer.metrics in get_metrics")
            self._train_metrics = check_metrics(self.task.get_metrics(is_train=True),
                                                f"{type(self.task).__name__}.get_metrics(is_train=True)")
        metric_names = list(self.task.host_metrics().metrics) if hasattr(self.task, "host_metrics") \
            else list(self._eval_metrics)
        for ev in self._eval_sets:
            check_metric_names(ev, metric_names)

    def _attach_callbacks(self, callbacks: Any, loggers: Any, a: Any, profiler: Profiler | None) -> None:
        """The run's loggers (the user's, the progress bar, the console, the run directory's files) and callbacks,
        in the order they hear events."""
        callbacks = [] if callbacks is None else \
            list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        loggers = [] if loggers is None else list(loggers) if isinstance(loggers, (list, tuple)) else [loggers]
        if a.progress_bar:
            loggers.append(ProgressBarLogger())
        if a.log_to_console:
            loggers.append(ConsoleLogger(log_interval=a.console_log_interval, stream=a.console_stream))
        if self.run_dir is not None:  # file loggers create the directory at their first write, not now
            loggers += [JSONLLogger(self.run_dir / "metrics.jsonl"), TensorboardLogger(self.run_dir / "tensorboard")]
            if is_installed("matplotlib"):
                loggers.append(PlotLogger(self.run_dir / "metrics.png", history=self.run_dir / "metrics.jsonl"))
            else:
                warnings.warn(f"run_dir: no metrics.png without matplotlib; install it with "
                              f"{how_to_install('matplotlib', 'plots')}", RuntimeWarning, stacklevel=3)
            if self.run_dir_uri is not None:  # last: they upload what the destinations above wrote
                loggers += [FolderUploader(self.run_dir), RemoteUploaderDownloader(self.run_dir_uri)]
        self.logger = Logger(loggers)
        self.nonfinite_checks = NonFiniteChecks(a.nonfinite, a.nonfinite_max_skips, self.logger)
        self.callbacks: list = callbacks + loggers
        self._listeners: dict = {}  # event -> the callbacks that handle it (Trainer._fire)
        if profiler is not None:  # first: at BATCH_START it decides whether the batch is traced
            self.callbacks.insert(0, profiler)
        needs_each_batch = [type(cb).__name__ for cb in self.callbacks if getattr(cb, "needs_each_batch_state", False)]
        if needs_each_batch and self.steps_per_execution > 1:
            raise ConfigurationError(
                f"steps_per_execution: {self.steps_per_execution} trains several batches per call, and callbacks see "
                f"the state after the call's last batch, but {needs_each_batch} read the train state at every "
                "batch's end; use steps_per_execution=1, or the Trainer's own save_folder/save_interval (which cut "
                "the calls where a save is due)")
        # per-parameter norms are computed in the step only for a callback that reads them (OptimizerMonitor)
        self._layer_norms = any(getattr(cb, "reads_layer_norms", False) for cb in self.callbacks)

    def _starting_state(self, a: Any, resume_step: int | None, load_dir: Path | None) -> tuple[Any, Timestamp]:
        """The train state laid out on the mesh and the timestamp training starts from: initialized, then restored
        by autoresume, or loaded from ``load_path``, or given a torch optimizer's own state."""
        state = self._place(steps.init_train_state(self.task, self.build_tx, self.composed, self.run_info,
                                                   self.seed, self.model_view))
        timestamp = Timestamp()
        if resume_step is not None:  # autoresume wins over load_path, as in Composer
            state, timestamp, meta = self.store.restore(resume_step, state)
            if self.engine is not None:
                self.engine.load_state_dicts(meta.get("algorithm_states", []))
            if a.progress_bar or a.log_to_console:  # said where people watch the run
                print(f"jaxcomposer: resuming from {self.store.location(resume_step)} at batch "
                      f"{timestamp.batch}", file=sys.stderr, flush=True)
            self.logger.log_hyperparameters({"resumed_from": self.store.location(resume_step),
                                             "resumed_at_batch": timestamp.batch})
        elif load_dir is not None:
            state, loaded_at, meta = checkpoint.restore(load_dir, state, weights_only=a.load_weights_only,
                                                        ignore_keys=a.load_ignore_keys, label=f"load_path {load_dir}")
            timestamp = loaded_at or timestamp  # weights only: training starts at batch 0
            if self.engine is not None and not a.load_weights_only:
                self.engine.load_state_dicts(meta.get("algorithm_states", []))
        elif self._foreign_optimizer is not None:  # an optimizer that already stepped (a torch checkpoint) goes on
            state = state._replace(opt_state=self._foreign_optimizer.load(state.opt_state))
        return state, timestamp

    def _place(self, state):
        """Lay the state out on the mesh (``jaxcomposer.parallel``): replicated for data parallelism, sharded over
        ``fsdp`` and ``tensor`` as the parallelism says. Copies (``may_alias=False``): the state's buffers are
        donated to the first step, so they must not be the model's own (a module the user passed stays usable)."""
        logical = parallel.logical_axes_of(self.task.source) if self.task.pure.bridged is None else None
        parallel.check_tensor_parallel(self.parallelism, logical, type(self.task.source).__name__)
        self.state_shardings, self.grad_shardings = parallel.train_state_shardings(
            state, self.mesh, self.parallelism, logical)
        return parallel.same_on_every_process(state, self.state_shardings, verify="the initial train state")

    # ---- the run's plan: max_duration lives in one place (self.plan; read through ReadsPlan) ----
    @property
    def run_info(self) -> RunInfo:
        return RunInfo(self.plan.total_steps, self.plan.steps_per_epoch, self.base_lr, self.precision)

    def _replan(self, max_duration: Time | None) -> None:
        """Build the plan (durations, total steps, the LR schedule) for ``max_duration`` and the current train
        loader. The schedule and the methods' static facts are baked into the compiled step, so a new plan drops
        the compiled steps."""
        steps_per_epoch = plan.steps_per_epoch(self.train_dataloader, self.train_subset_num_batches)
        batch_size, tokens_per_batch = plan.batch_facts(self.train_dataloader, max_duration, self.schedulers,
                                                        lambda: self._count_tokens(self._example_batch()))
        self.plan = RunPlan(max_duration, plan.total_steps(max_duration, steps_per_epoch, batch_size,
                                                           tokens_per_batch), steps_per_epoch)
        alpha = compose_schedules(self.schedulers, max_batches=self.plan.total_steps,
                                  max_duration=self.plan.max_duration, steps_per_epoch=steps_per_epoch,
                                  ssr=self.scale_schedule_ratio, batch_size=batch_size,
                                  tokens_per_batch=tokens_per_batch)
        self._alpha = alpha
        self.build_tx = steps.make_base_tx(self.optimizer, alpha, self.composed)
        # the schedule the step compiles in, callable on the host (LR reads go through the table)
        self.lr_multiplier = jax.jit(lambda step: self.composed.wrap_schedule(alpha, self._host_ctx(step))(step))
        self.lr_table = HostLRTable(self.lr_multiplier)
        self._train_steps: dict = {}
        self._eval_steps: dict = {}  # by the DataSpec transforms they run (data_spec.transform_key)
        self._predict_steps: dict = {}
        if getattr(self, "state", None) is not None:
            self.state.plan = self.plan

    # ---- public API ----
    def fit(self, *, train_dataloader: Iterable | None = None, duration: int | str | Time | None = None) -> RunState:
        """Train until ``max_duration``, as Composer's ``Trainer.fit``.

        ``train_dataloader`` replaces the loader given at construction. ``duration`` trains that much more from
        the current timestamp (``'2ep'``, ``'100ba'``, or an int of epochs): as in Composer, ``max_duration``
        becomes ``timestamp + duration``, so schedules and methods plan with the new length (and the step is
        compiled again). Either argument makes a new plan; a call without them continues the current one."""
        if train_dataloader is not None:
            self._user_train_loader = train_dataloader
            train_dataloader, self.train_data_spec = self._unwrap(train_dataloader)
            self.train_dataloader = as_loader(train_dataloader, "train_dataloader")
        if duration is not None:
            d = options.parse_duration(duration, "duration")
            self._replan(Time(self.state.timestamp.get(d.unit).value + d.value, d.unit))
        elif train_dataloader is not None:
            self._replan(self.max_duration)
        if self.train_dataloader is None or self.max_duration is None:
            missing = "train_dataloader" if self.train_dataloader is None else "max_duration"
            raise ConfigurationError(f"{missing}: required to fit (e.g. max_duration='10ep', or "
                                     "fit(duration='10ep')).")
        st = self.state
        st.stop_requested = False
        try:
            with PreemptionGuard() as preemption:
                self._fit_loop(preemption)
        finally:  # also on a preemption or an error: the module holds the last good weights
            self._sync_model()
            if self.profiler is not None:  # an error mid-window: stop the device trace, write what was traced
                self.profiler.flush(st)
        return st

    def _fit_loop(self, preemption: "PreemptionGuard") -> None:
        """FIT_START; epochs until the duration is reached or a stop is asked; the final evaluation, checkpoint
        and FIT_END."""
        st = self.state
        self._fire(Event.FIT_START)
        self._mark = time.perf_counter()
        self._last_eval_batch = -1
        conv_tuner = adapters.loaded_kernel("torch", "conv_autotune")  # conv_impl='auto' (models, bridged CNNs)
        self._conv_mark = None if conv_tuner is None or self._conv_choices_said else len(conv_tuner().traced)
        while not self._done() and not st.stop_requested:
            self._train_epoch(preemption)
        self._finish_fit()

    def _train_epoch(self, preemption: "PreemptionGuard") -> None:
        """The epoch from where the timestamp is: EPOCH_START, its batches in compiled calls, and the epoch's close
        (EPOCH_END, evaluation, checkpoint), unless training stops inside it: then a later ``fit`` goes on inside
        this epoch. A stop signal ends training after the call it arrived in (after the close on an epoch's last
        call), as the host may act only between calls."""
        st = self.state
        self._seek_train_data()
        st.train_metric_sums = None  # as Composer resets its train metrics each epoch
        self._fire(Event.EPOCH_START)
        batches = self._device_batches(self.train_dataloader, self.train_subset_num_batches, check=True,
                                       position=(st.timestamp.epoch, st.timestamp.batch_in_epoch))
        seen, stop_signal = 0, None
        for chunk in self._chunks(batches):
            seen += len(chunk)
            stop_signal = self._train_call(chunk, preemption)
            if self._epoch_complete():
                continue  # the loader is exhausted: the epoch closes below
            if stop_signal is not None:
                self._preempted(stop_signal)
            if self._done() or st.stop_requested:
                return
        if seen == 0:
            raise ConfigurationError("train_dataloader: yielded no batches in an epoch (empty dataset?)")
        self._close_epoch(stop_signal)

    def _train_call(self, chunk: list[dict], preemption: "PreemptionGuard") -> int | None:
        """The batches of one compiled call (one batch, or up to ``steps_per_execution`` trained at once), each
        with its events; the stop signal that arrived meanwhile, or None."""
        chunk_metrics = self._train_chunk_in_one_call(chunk) if self.steps_per_execution > 1 \
            and self.microbatch_size != "auto" else None
        stop_signal = None
        for i, batch in enumerate(chunk):
            self._train_batch(batch, None if chunk_metrics is None else chunk_metrics[i])
            signal_now = preemption.poll(self.state.timestamp.batch)  # every batch: a collective across processes
            stop_signal = stop_signal or signal_now
        return stop_signal

    def _train_batch(self, batch: dict, metrics: dict | None) -> None:
        """One batch's events around its step (``metrics``: the step already ran in a multi-batch call), then the
        clock, the logs, and the evaluation and checkpoint due at its end."""
        st = self.state
        st.batch = batch
        self._fire(Event.BEFORE_DATALOADER)  # (the prefetcher read it already; the order is Composer's)
        self._fire(Event.AFTER_DATALOADER)
        self._fire(Event.BATCH_START)
        self._fire(Event.BEFORE_TRAIN_BATCH)
        n = rows_in(batch)
        if metrics is None:
            stage = self.composed.stage({k: tuple(v.shape) for k, v in batch.items()},
                                        self._host_ctx(int(st.timestamp.batch)))
            self._host_lr = self._host_multiplier()
            if self.microbatch_size == "auto":
                self.microbatch_size = self._auto_microbatch_size(batch, stage)
            host = None
            if self.engine is not None:  # users' algorithms: match and replay, on the host
                batch, stage, host = self._prepare_algorithms(batch, stage)
                n = rows_in(batch)
            with self._marker("step", device_step=True):
                st.train_state, metrics = self._step_for(n)(st.train_state, batch, stage, self._host_lr, host)
        st.batch_size, st.batch = n, batch
        st.timestamp = st.timestamp.to_next_batch(samples=self._count_samples(batch),
                                                  tokens=self._count_tokens(batch), duration=self._since_mark())
        st.batch_metrics = metrics
        if self.step_schedulers_every_batch and self.torch_schedulers:  # after the step, as Composer
            self._step_torch_schedulers()
        if self._foreign_optimizer is not None:  # its groups' lr: the next step's, as a torch scheduler's
            self._foreign_optimizer.set_lr(self.lr_table(int(st.timestamp.batch)) * self._host_lr)
        # checked without waiting on the device (the state is safe meanwhile: the step itself refuses non-finite
        # updates), so the host keeps steps queued instead of waking on every one
        self.nonfinite_checks.add(st.timestamp.batch, metrics)
        self.logger.set_step(st.timestamp.batch)
        self.logger.log_metrics({"loss/train/total": metrics["loss"]})
        if "logs" in metrics:  # what in-step algorithms logged, with this batch's values
            self.logger.log_metrics(metrics["logs"])
        if self._train_metrics:
            self._log_train_metrics(metrics["train_metrics"])
        self._fire_step_events(n)
        self._fire(Event.BATCH_END)
        self._say_conv_choices()
        # (a multi-batch call ends where an evaluation or a checkpoint is due: _chunk_length)
        self._run_eval(TimeUnit.BATCH)
        if not self._epoch_complete() and self._due(self.save_interval, TimeUnit.BATCH):
            self._save()  # (an epoch's last batch is saved after the epoch closes)
        self._fire(Event.BATCH_CHECKPOINT)

    def _epoch_complete(self) -> bool:
        return bool(self.steps_per_epoch) and self.state.timestamp.batch_in_epoch >= self.steps_per_epoch

    def _close_epoch(self, stop_signal: int | None) -> None:
        """The epoch's end: the clock, torch schedulers stepped per epoch, EPOCH_END, the evaluation and the
        checkpoint due, EPOCH_CHECKPOINT; then a stop signal that arrived in its last call."""
        st = self.state
        self._fire(Event.BEFORE_DATALOADER)  # Composer's once more, for the loader's exhaustion
        st.timestamp = st.timestamp.to_next_epoch(duration=self._since_mark())
        if not self.step_schedulers_every_batch and self.torch_schedulers:  # Composer's default for them
            self._step_torch_schedulers()
        self._fire(Event.EPOCH_END)
        self._run_eval(TimeUnit.EPOCH)
        if self._due(self.save_interval, TimeUnit.EPOCH) or \
                self._due(self.save_interval, TimeUnit.BATCH, st.timestamp.batch):
            self._save()
        self._fire(Event.EPOCH_CHECKPOINT)
        if stop_signal is not None:
            self._preempted(stop_signal)

    def _finish_fit(self) -> None:
        """After the last epoch or a stop: the final weights evaluated and saved, then FIT_END."""
        st = self.state
        # the prefetcher read a few batches ahead, and how many depends on timing: leave the loader where training
        # is, so its position after fit is what was trained (and the same in a resumed run as in a straight one)
        self._seek_train_data()
        if self._last_eval_batch != st.timestamp.batch:
            self._run_eval(None)  # the final weights always get evaluated (by every set with an interval)
        self.nonfinite_checks.check()
        if self.store is not None:
            if self._last_saved != st.timestamp.batch:
                self._save()  # the end of training is always saved
            self.store.wait()
        self._sync_model()  # FIT_END callbacks (export, generation) see the trained weights in state.model
        self._fire(Event.FIT_END)

    def _preempted(self, signum: int) -> None:
        """SIGTERM/SIGINT arrived: the current step is done; save it (when saving is configured) and stop."""
        self.nonfinite_checks.check()
        if self.store is not None and self._last_saved != self.state.timestamp.batch:
            self._save()
        if self.store is not None:
            self.store.wait()
        raise Preempted(signum, self.state.timestamp.batch, self.store.folder if self.store else None)

    def save_checkpoint(self, path: str | Path, weights_only: bool = False) -> Path:
        """Save everything needed to continue bit for bit (the ``TrainState`` and the timestamp) to a new
        directory, or only the params and model state with ``weights_only``."""
        self._sync_model()
        return checkpoint.save_checkpoint(path, self.state.train_state, self.state.timestamp, self._meta(),
                                          weights_only=weights_only)

    def _sync_model(self) -> None:
        """Write the current weights into the module the user passed (``state.model``), as Composer's model object
        is the trained model: an NNX module is updated in place, a torch module gets them through the bridge.
        Skipped when nothing changed since the last write."""
        train_state = self.state.train_state
        if train_state.params is self._synced_params:
            return
        write_back = self.task.pure.write_back
        if write_back is not None:
            self.state.model = write_back(train_state.params, train_state.model_state)
        if self._foreign_optimizer is not None:  # and the optimizer's state, its groups' lr the next step's
            step = int(train_state.step)
            self._foreign_optimizer.save(train_state.opt_state, self.lr_table(step) * self._host_lr)
        self._synced_params = train_state.params

    def _synced_model(self) -> Any:
        self._sync_model()
        return self.state.model

    def _meta(self) -> dict:
        meta = {"run_name": self.run_name, "seed": self.seed, "algorithms": list(self.composed.names)}
        if self.engine is not None:  # users' algorithms' own state (Composer checkpoints each state_dict())
            meta["algorithm_states"] = self.engine.state_dicts()
        return meta

    def _save(self) -> None:
        if self.store is None:
            return
        self.nonfinite_checks.check()  # never save past a step that should have raised
        st = self.state
        with self._marker("checkpoint"):
            self.store.save(st.timestamp.batch, st.train_state, st.timestamp, self._meta())
        self._last_saved = st.timestamp.batch

    def _due(self, interval: Time | Callable | None, unit: TimeUnit, count: int | None = None) -> bool:
        if callable(interval):  # Composer's (state, event) -> bool, asked at every batch and epoch end
            return bool(interval(self.state, Event.BATCH_END if unit == TimeUnit.BATCH else Event.EPOCH_END))
        if interval is None or interval.unit != unit:
            return False
        count = self.state.timestamp.get(unit).value if count is None else count
        return count % interval.value == 0

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        for cb in self.callbacks:
            cb.close(self.state, self.logger)
        if self.run_dir_uri is not None:  # uploaded by now (the uploader's close waited): the staged copy goes
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- helpers ----
    def _log_train_metrics(self, batch_sums: dict) -> None:
        """The epoch's train metrics so far, as Composer logs them after every batch: the sums add up on the device,
        and the values go to the loggers as device scalars (read when a destination writes them)."""
        st = self.state
        st.train_metric_sums = batch_sums if st.train_metric_sums is None else \
            {name: merge(st.train_metric_sums[name], sums) for name, sums in batch_sums.items()}
        self.logger.log_metrics({f"metrics/train/{name}": m.compute(st.train_metric_sums[name])
                                 for name, m in self._train_metrics.items()})

    def _marker(self, name: str, **kwargs):
        """The profiler's marker ``name`` (a no-op context without a profiler): a range in the traces."""
        return self.profiler.marker(name, **kwargs) if self.profiler is not None else contextlib.nullcontext()

    def _fire(self, event: Event) -> None:
        """Algorithms first, then callbacks and loggers; at INIT the other way round (Composer's engine). At the
        in-step events the algorithms ran inside the step; the callbacks hear of them after it."""
        host_algorithms = self.engine is not None and event not in IN_STEP_EVENTS
        if host_algorithms and event is not Event.INIT:
            self.engine.run_host(event, self.state, self.logger)
        listeners = self._listeners.get(event)
        if listeners is None:  # who handles the event, found once: most callbacks handle a few of Composer's 40
            listeners = self._listeners[event] = [
                cb for cb in self.callbacks if type(cb).run_event is not Callback.run_event
                or callable(getattr(cb, event.value, None))]
        for cb in listeners:
            cb.run_event(event, self.state, self.logger)
        if host_algorithms and event is Event.INIT:
            self.engine.run_host(event, self.state, self.logger)

    def _fire_step_events(self, batch_size: int) -> None:
        """The events inside the step that just ran, to the callbacks, in Composer's order: the forward-to-backward
        ones once per microbatch, then AFTER_TRAIN_BATCH. ``state.loss`` is the step's loss (a device scalar);
        ``state.outputs`` stays inside the step."""
        n = 1 if not isinstance(self.microbatch_size, int) else max(batch_size // self.microbatch_size, 1)
        for _ in range(n):
            for event in _MICROBATCH_EVENTS:
                self._fire(event)
        self._fire(Event.AFTER_TRAIN_BATCH)

    def _prepare_algorithms(self, batch: dict, stage) -> tuple[dict, Any, Any]:
        """The users' algorithms before a step (``AlgorithmEngine.prepare_step``): the batch (changed on the host
        by applies that cannot be traced), the stage with the engine's variant, and the arrays its programs take."""
        st, sharding = self.state, parallel.batch_sharding(self.mesh)
        st.batch = batch
        loader_adapter = adapters.adapter_for(self._user_train_loader)

        def host_batch(device_batch: dict):
            arrays = jax.device_get(device_batch)
            if loader_adapter is not None and loader_adapter.from_array is not None:
                arrays = {k: loader_adapter.from_array(None, v) for k, v in arrays.items()}
            return (arrays["input"], arrays["target"]) if self.engine.pair_batches else arrays

        def place(host: Any) -> dict:
            new = as_batch(host)
            self._check_train_batch(new)
            return parallel.process_rows_to_global(new, sharding)

        batch_transform, microbatch_transform = data_spec.step_transforms(self.train_data_spec)
        n_micro = 1 if self.microbatch_size in (None, "auto") else rows_in(batch) // self.microbatch_size
        forward = steps.make_forward(self.task, self.precision)
        params, model_state = st.train_state.params, st.train_state.model_state
        abstract = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)

        def step_batch_avals(b: dict):
            return abstract(b) if batch_transform is None else jax.eval_shape(batch_transform, abstract(dict(b)))

        def loss_batch_avals(b):
            micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // n_micro,) + x.shape[1:], x.dtype), b)
            return micro if microbatch_transform is None else jax.eval_shape(microbatch_transform, micro)

        def output_avals(b):
            return jax.eval_shape(lambda p, s, x: forward(p, s, x, train=True, key=jax.random.PRNGKey(0))[0],
                                  params, model_state, b)

        batch, variant, consts = self.engine.prepare_step(
            st, batch, self.logger, host_batch=host_batch, place=place, step_batch_avals=step_batch_avals,
            loss_batch_avals=loss_batch_avals, output_avals=output_avals, params=params)
        if variant is None:
            return batch, stage, None
        return batch, (stage or ()) + ((ENGINE_NAME, variant),), {ENGINE_NAME: consts}

    def _host_ctx(self, step: int) -> StepCtx:
        """The ctx host-side slots (stage, data) and the LR monitor see at ``step``."""
        return StepCtx(step=step, run=self.run_info, model=self.model_view)

    def _since_mark(self) -> datetime.timedelta:
        """Wall time since the previous batch or epoch end: summed, the timestamp's ``total_wct`` is the fit's
        wall-clock time (timing the asynchronous dispatch alone would measure almost nothing)."""
        now = time.perf_counter()
        elapsed, self._mark = now - self._mark, now
        return datetime.timedelta(seconds=elapsed)

    def _example_batch(self) -> dict:
        return as_batch(self._first_raw_batch())

    def _unwrap(self, loader) -> tuple:
        """``data_spec.unwrap``, except that the Trainer's own loader (``trainer.eval_dataloader`` passed back to
        ``eval``, ``predict`` or ``fit``) keeps the DataSpec it came in: its batches are only right with those
        transforms (``fit`` hands the Trainer uint8 images, normalized in the step)."""
        loader, spec = data_spec.unwrap(loader)
        if spec is None:
            owned = ((self.train_dataloader, self.train_data_spec), (self.eval_dataloader, self.eval_data_spec))
            for own, own_spec in owned:
                if loader is own and own is not None:
                    return loader, own_spec
        return loader, spec

    def _model_batch(self, batch: dict) -> dict:
        """A host batch as the model sees it: after the train (else eval) DataSpec's transforms, run eagerly here
        (a torch module is exported with it; methods trace the model with it)."""
        spec = self.train_data_spec if self.train_dataloader is not None else self.eval_data_spec
        transform = data_spec.whole_batch_transform(spec)
        return batch if transform is None else jax.tree.map(np.asarray, transform(dict(batch)))

    def _count_samples(self, batch: dict) -> int:
        """Samples in a train batch: the DataSpec's ``get_num_samples_in_batch``, else the leading dimension."""
        count = getattr(self.train_data_spec, "get_num_samples_in_batch", None)
        return rows_in(batch) if count is None else int(count(batch))

    def _count_tokens(self, batch: dict) -> int:
        """Tokens in a train batch: the DataSpec's ``get_num_tokens_in_batch``, else the task's count."""
        count = getattr(self.train_data_spec, "get_num_tokens_in_batch", None)
        return self.task.num_tokens(batch) if count is None else int(count(batch))

    def _first_raw_batch(self):
        for loader in (self.train_dataloader, self.eval_dataloader):
            if loader is not None:
                for raw in loader:
                    return raw
        raise ConfigurationError("model: a torch module is exported with example inputs taken from the first "
                                 "batch, but there is no train_dataloader or eval_dataloader to take it from")

    def _seek_train_data(self) -> None:
        """Point the loader at the timestamp's position. Loaders are deterministic per (seed, epoch), so this is
        what makes resume exact, and it also discards batches the prefetcher read ahead before a stop."""
        ts, loader = self.state.timestamp, self.train_dataloader
        if hasattr(loader, "set_state"):
            loader.set_state({"epoch": ts.epoch, "batch_index": ts.batch_in_epoch})
        elif hasattr(loader, "set_epoch"):
            loader.set_epoch(ts.epoch)

    def _done(self) -> bool:
        ts = self.state.timestamp
        return ts.get(self.max_duration.unit).value >= self.max_duration.value

    def _lr_at(self, step: int) -> float | None:
        """The LR at ``step``; a Composer-style function scheduler contributes its latest value."""
        if self.base_lr is None:
            return None
        return float(self.base_lr * self.lr_table(step) * self._host_lr)

    def _step_torch_schedulers(self) -> None:
        """Step the torch LR schedulers; the next step's host LR factor is read from them again."""
        for sched in self.torch_schedulers:
            sched.step()
        self._host_lr = self._host_multiplier()

    def _host_multiplier(self) -> float:
        """The product of the Composer-style function schedulers at the current state, as Composer's LambdaLR
        asks them before each batch (``timestamp.batch`` = batches trained so far)."""
        value = 1.0
        for sched in self.torch_schedulers:
            value *= sched.multiplier()
        for i, sched in enumerate(self.host_schedulers):
            try:
                value *= float(call_function_scheduler(sched, self.state, self.scale_schedule_ratio))
            except TypeError as e:
                raise ConfigurationError(f"schedulers[{i}]: calling {getattr(sched, '__name__', sched)!r} failed "
                                         f"({e}); a function scheduler has Composer's signature (state) or "
                                         "(state, ssr=1.0) -> float") from e
        return value

    def _step_for(self, batch_size: int):
        """The jitted train step for a batch size (the number of microbatches is static: one compile each)."""
        return self._step_with(1 if self.microbatch_size is None else batch_size // self.microbatch_size)

    def _pure_train_step(self, n: int):
        batch_transform, microbatch_transform = data_spec.step_transforms(self.train_data_spec)
        return steps.make_train_step(self.task, self.build_tx, self.composed, self.run_info, precision=self.precision,
                                     num_microbatches=n, mesh=self.mesh, grad_shardings=self.grad_shardings,
                                     model_view=self.model_view, batch_transform=batch_transform,
                                     microbatch_transform=microbatch_transform, layer_norms=self._layer_norms,
                                     train_metrics=self._train_metrics)

    def _step_with(self, n: int):
        if n not in self._train_steps:
            self._train_steps[n] = collector_paused(
                steps.jit_train_step(self._pure_train_step(n), self.mesh, self.state_shardings, host_args=2))
        return self._train_steps[n]

    def _multi_step_for(self, batch_size: int, k: int):
        """The jitted call that trains ``k`` batches (``steps.make_multi_step``); one compile per batch size."""
        n = 1 if self.microbatch_size is None else batch_size // self.microbatch_size
        if ("multi", n, k) not in self._train_steps:
            self._train_steps["multi", n, k] = collector_paused(steps.jit_train_step(
                steps.make_multi_step(self._pure_train_step(n), k), self.mesh, self.state_shardings))
        return self._train_steps["multi", n, k]

    def _chunks(self, batches: Iterable):
        """``batches`` grouped into the calls that train them (``multi_step``): one batch each, or up to
        ``steps_per_execution`` where the host need not act between them."""
        def length() -> int:
            if self.steps_per_execution == 1 or self.microbatch_size == "auto":  # 'auto' before its first batch
                return 1
            intervals = [ev.interval for ev in self._eval_sets]
            intervals += [self.save_interval] if self.store is not None else []
            return multi_step.call_length(self.steps_per_execution, self.state.timestamp, self.max_duration,
                                          self.steps_per_epoch, intervals)
        return multi_step.group_calls(batches, length)

    def _train_chunk_in_one_call(self, chunk: list[dict]) -> list[dict] | None:
        """Trains ``chunk`` in one multi-step call (padded to ``steps_per_execution`` with its last batch, whose
        extra steps the program skips) and returns each batch's metrics; None, with nothing trained, when the
        methods give its batches different stages, which compile differently: they then run one by one."""
        st = self.state
        first = int(st.timestamp.batch)
        shapes = {k: tuple(v.shape) for k, v in chunk[0].items()}
        stages = [self.composed.stage(shapes, self._host_ctx(first + i)) for i in range(len(chunk))]
        if any(stage != stages[0] for stage in stages):
            return None
        k = self.steps_per_execution
        padded = tuple(chunk) + (chunk[-1],) * (k - len(chunk))
        with self._marker("step", device_step=True):
            st.train_state, metrics = self._multi_step_for(rows_in(chunk[0]), k)(
                st.train_state, padded, stages[0], np.int32(len(chunk)))
        return metrics[:len(chunk)]

    def compiled_programs(self, kind: str = "train") -> dict:
        """How many programs each compiled ``kind`` step (``'train'``, ``'eval'`` or ``'predict'``) holds, by its
        key. Train steps: the number of microbatches, or ``('multi', microbatches, k)`` for the call that trains
        ``k`` batches (``steps_per_execution``); eval and predict steps: the DataSpec transforms they run (and the
        metrics an Evaluator asks for). A step compiles once per batch shapes and methods' stage: this is what
        recompilation checks read."""
        steps_by_kind = {"train": self._train_steps, "eval": self._eval_steps, "predict": self._predict_steps}
        if kind not in steps_by_kind:
            raise ValueError(f"compiled_programs: kind must be one of {sorted(steps_by_kind)}, got {kind!r}")
        return {key: step._cache_size() for key, step in steps_by_kind[kind].items()}

    def compiled_train_step(self, batch: dict, stage=None, num_microbatches: int = 1):
        """The train step compiled ahead of time for this batch's shapes (``jax.stages.Compiled``): its
        ``memory_analysis()`` says what a step needs per device before one runs."""
        step = self._step_with(num_microbatches)
        sharding = parallel.batch_sharding(self.mesh)
        abstract = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # as _device_batches lays out
        # the live train state (lowering reads only its types and layouts) and batches laid out as the run's: the
        # arguments a step call sees, so a step already run is not traced or compiled again, and the step compiled
        # here is the one the run then calls ('auto' does not compile its choice twice)
        return step.lower(self.state.train_state, jax.tree.map(abstract, batch), stage, self._host_lr,
                          None).compile()

    def _auto_microbatch_size(self, batch: dict, stage) -> int:
        """``device_train_microbatch_size='auto'`` (``microbatching``), chosen at the first batch and said."""
        n = rows_in(batch)
        budget = self.device_memory_bytes or (self.mesh.devices.flat[0].memory_stats() or {}).get("bytes_limit")
        chosen, needs = microbatching.largest_fitting_microbatch(
            n, self.num_devices, budget,
            lambda m: parallel.memory_per_device(self.compiled_train_step(batch, stage, n // m))["peak"])
        why = "no device memory limit known" if budget is None else \
            f"peak {needs[chosen]:,} of {budget:,} bytes per device"
        self.logger.log_hyperparameters({"device_train_microbatch_size": chosen})
        self._tell(f"device_train_microbatch_size='auto' chose {chosen} ({why})")
        self.auto_microbatch_report = {"chosen": chosen, "budget_bytes": budget, "peak_bytes_by_size": needs}
        return chosen

    def _tell(self, message: str) -> None:
        """A line on stderr where people watch the run (a progress bar or console logging)."""
        if any(isinstance(d, (ProgressBarLogger, ConsoleLogger)) for d in self.logger.destinations):
            print(f"jaxcomposer: {message}", file=sys.stderr, flush=True)

    def _say_conv_choices(self) -> None:
        """What ``conv_impl='auto'`` chose for the convolutions of the first step (once per Trainer, after it):
        logged as the ``conv_impl`` hyperparameter and said on the console."""
        if self._conv_mark is None:
            return
        summary = adapters.loaded_kernel("torch", "conv_autotune")().summary(since=self._conv_mark)
        self._conv_choices_said, self._conv_mark = True, None
        if summary is not None:
            self.logger.log_hyperparameters({"conv_impl": summary})
            self._tell(f"conv_impl='auto' chose {summary}")

    def _device_batches(self, loader: Iterable, subset: int, check: bool, position: tuple[int, int] | None = None):
        """Batches on device, prefetched. ``position`` (epoch, first batch in epoch) marks a training pass: there
        the host-side data methods (RandAugment, ...) run, seeded by (seed, epoch, batch) so resume is exact."""
        sharding = parallel.batch_sharding(self.mesh)
        augment = position is not None and self.composed.has_data
        start = 0 if position is None else position[1]  # a resumed epoch starts mid-way: count from there
        first_step = int(self.state.timestamp.batch)  # the clock at this pass's first batch

        def host_batches():
            for i, raw in enumerate(loader, start):
                if subset >= 0 and i >= subset:
                    return
                batch = as_batch(raw)
                if check:
                    self._check_train_batch(batch)
                if augment:
                    ctx = self._host_ctx(first_step + i - start)
                    batch = self.composed.apply_data(batch, ctx, (self.seed, position[0], i))
                yield batch

        # several processes: each loader holds its process's rows (shard_for_processes), Composer's per-rank
        # batches; together they make the global batch (one process: a plain device_put)
        batches = prefetch_to_device(host_batches(), size=2, sharding=sharding,
                                     place=lambda batch: parallel.process_rows_to_global(batch, sharding))
        return batches if self.profiler is None else self.profiler.marked_iter("dataloader/train", batches)

    def _check_train_batch(self, batch: dict) -> None:
        n = rows_in(batch) * jax.process_count()  # the global batch
        if n % self.num_devices:
            raise ConfigurationError(
                f"train batch size {n} is not divisible by the {self.num_devices} devices of the data axis; "
                "use a multiple of the device count (or drop_last=True so the last batch is full).")
        if isinstance(self.microbatch_size, int) and (n % self.microbatch_size
                                                 or self.microbatch_size % self.num_devices):
            raise ConfigurationError(
                f"device_train_microbatch_size: {self.microbatch_size} must divide the batch size {n} and be a "
                f"multiple of the device count {self.num_devices}.")


def _algorithm_engine(user_algorithms: list, passes: Any, steps_per_execution: int) -> tuple[Any, list]:
    """``(engine or None, the methods to compose)``: users' Composer Algorithms (match/apply) run through one
    engine, a Method that takes the first one's place among the built-in methods."""
    custom = [alg for alg in user_algorithms if is_algorithm(alg) and not isinstance(alg, Method)]
    if passes is not None and not custom:
        raise ConfigurationError("algorithm_passes: given, but algorithms holds no Composer Algorithm (match/"
                                 "apply) for them to order; the built-in methods order themselves (their order)")
    if not custom:
        return None, user_algorithms
    if steps_per_execution > 1:
        raise ConfigurationError(
            f"steps_per_execution: {steps_per_execution} trains several batches per call, but algorithms "
            "holds Composer Algorithms, whose match is asked before every batch; use steps_per_execution=1")
    engine = AlgorithmEngine(custom, pair_batches=False, passes=passes,
                             methods=tuple(alg for alg in user_algorithms if isinstance(alg, Method)))
    # anything else stays for compose to check
    first = next(i for i, alg in enumerate(user_algorithms) if alg is custom[0])
    others = lambda part: [alg for alg in part if all(alg is not c for c in custom)]  # noqa: E731
    return engine, others(user_algorithms[:first]) + [engine.method()] + others(user_algorithms[first:])


def _split_schedulers(schedulers: list) -> tuple[list, list]:
    """``(ours and Composer-style functions, [(index, scheduler, adapter)] of other frameworks' (torch LR
    schedulers))``; anything else is refused by its index."""
    own, foreign = [], []
    for i, sched in enumerate(schedulers):
        adapter = adapters.adapter_for(sched)
        if adapter is not None and adapter.to_scheduler is not None:
            foreign.append((i, sched, adapter))
        elif callable(sched) or hasattr(sched, "schedule"):
            own.append(sched)
        else:
            raise ConfigurationError(f"schedulers[{i}]: got {type(sched).__name__}, expected a scheduler from "
                                     "jaxcomposer.optim, a torch LR scheduler or a Composer-style function "
                                     "(state, ssr=1.0) -> float")
    return own, foreign


def _translate_optimizer(optimizer: Any, user_model: Any) -> tuple[Any, Any]:
    """``(the optax transformation the step runs, the framework optimizer's binding or None)``: an optax one as
    given; a torch optimizer through its adapter (checked against ``user_model``'s parameters now)."""
    adapter = adapters.adapter_for(optimizer)
    foreign = adapter.to_optimizer(optimizer, user_model) if adapter is not None and adapter.to_optimizer else None
    if foreign is not None:
        return foreign.tx, foreign
    if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise ConfigurationError(
            f"optimizers: got {type(optimizer).__module__}.{type(optimizer).__name__}, expected an optax "
            "GradientTransformation (jaxcomposer.optim.DecoupledSGDW, optax.adamw, ...) or a torch optimizer built "
            "on the model's parameters (torch.optim.SGD(model.parameters(), lr=0.1))")
    return optimizer, None


if Trainer.__doc__:  # the Args section, from the option table, in the signature's order
    Trainer.__doc__ += options.args_doc(tuple(options.TRAINER_OPTIONS[name] for name in
                                              inspect.signature(Trainer.__init__).parameters if name != "self"))
