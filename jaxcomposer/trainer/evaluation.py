"""The Trainer's evaluation and prediction: ``eval``, ``predict``, and the evaluations due during ``fit``."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import numpy as np

from jaxcomposer import parallel
from jaxcomposer.core import adapters
from jaxcomposer.core.collector import collector_paused
from jaxcomposer.core.evaluator import EvalSet, Evaluator, as_evaluators, resolve_evaluator
from jaxcomposer.core.events import Event
from jaxcomposer.core.run_state import MetricValue
from jaxcomposer.core.time import TimeUnit, Timestamp
from jaxcomposer.data import data_spec
from jaxcomposer.errors import ConfigurationError
from jaxcomposer.metrics.base import compute_all, sum_states
from jaxcomposer.trainer import step as steps
from jaxcomposer.trainer.batches import as_batch, as_loader, pad_batch, round_up, rows_in


class EvaluationAndPrediction:
    """Part of :class:`~jaxcomposer.trainer.Trainer` (a base class of it): reads the Trainer's state, task, mesh,
    loggers and events, and keeps its compiled eval and predict steps."""

    def eval(self, eval_dataloader: Iterable | None = None, subset_num_batches: int = -1,
             label: str = "eval") -> dict[str, float]:
        """Evaluate now, as Composer's ``Trainer.eval``: ``eval_dataloader`` (a loader, a DataSpec, an Evaluator
        or a list of them; default: the Trainer's evaluation sets) under ``label`` (an Evaluator's own label wins).
        Returns the metrics of the last set evaluated; all of them are in ``state.eval_metrics[label]``."""
        self._sync_model()  # asked by the user: their module holds the weights being evaluated
        if eval_dataloader is None and self._eval_sets:
            sets = self._eval_sets
        elif isinstance(eval_dataloader, (Evaluator, list, tuple)):
            sets = [self._eval_set(ev) for ev in as_evaluators(eval_dataloader)]
        else:
            sets = None
        self._fire(Event.EVAL_STANDALONE_START)
        self._fire(Event.EVAL_BEFORE_ALL)
        if sets is None:
            metrics = self._evaluate(eval_dataloader, subset_num_batches, label)
        for ev in sets or ():
            metrics = self._evaluate(ev.loader, subset_num_batches if subset_num_batches != -1 else ev.subset,
                                     ev.label, spec=ev.spec, metric_names=ev.metric_names)
        self._fire(Event.EVAL_AFTER_ALL)
        self._fire(Event.EVAL_STANDALONE_END)
        return metrics

    def _eval_set(self, ev: Evaluator) -> EvalSet:
        return resolve_evaluator(ev, self.eval_interval, as_loader)

    def _evaluate(self, eval_dataloader: Iterable | None, subset_num_batches: int, label: str, *,
                  spec: Any = None, metric_names: tuple[str, ...] | None = None) -> dict[str, float]:
        """Evaluation itself; the fit loop calls it directly (the module is written back at the end of fit)."""
        loader, spec = self._unwrap(eval_dataloader) if spec is None and eval_dataloader is not None else \
            (eval_dataloader, spec) if eval_dataloader is not None else (self.eval_dataloader, self.eval_data_spec)
        if loader is None:
            raise ConfigurationError("eval_dataloader: required to evaluate")
        eval_metrics = self._eval_metrics if metric_names is None else \
            {name: m for name, m in self._eval_metrics.items() if name in metric_names}
        key = (data_spec.transform_key(spec), metric_names)
        # a task whose metrics live on the host (a torch ComposerModel's torchmetrics) sees each batch's outputs
        host = self.task.host_metrics() if hasattr(self.task, "host_metrics") else None
        if host is not None and metric_names is not None:
            host.metrics = {name: m for name, m in host.metrics.items() if name in metric_names}
        if key not in self._eval_steps and host is None:
            self._eval_steps[key] = collector_paused(steps.jit_eval_step(steps.make_eval_step(
                self.task, self.composed, self.run_info, eval_metrics, precision=self.precision,
                batch_transform=data_spec.whole_batch_transform(spec)), self.mesh, self.state_shardings))
        self.state.eval_timestamp = Timestamp()
        self._fire(Event.EVAL_START)
        parts, count, pad_to = [], 0, None
        n_batches = subset_num_batches if subset_num_batches != -1 else self.eval_subset_num_batches
        if hasattr(loader, "set_state"):  # every evaluation sees the same batches, from the first one
            loader.set_state({"epoch": 0, "batch_index": 0})
        for i, raw in enumerate(loader):
            if n_batches >= 0 and i >= n_batches:
                break
            batch = as_batch(raw)
            count += rows_in(batch)
            self.state.batch = batch  # as Composer's state.batch during evaluation (unpadded, on the host)
            for event in (Event.EVAL_BATCH_START, Event.EVAL_BEFORE_FORWARD, Event.EVAL_AFTER_FORWARD):
                self._fire(event)  # (the forward runs in the compiled eval step, between the last two)
            if host is not None:  # unpadded: the metrics see exactly the loader's examples
                host.update(batch, self._predict_fn(spec)(self.state.train_state, batch))
            else:  # each batch's sums stay on the device until the end: no sync per batch
                pad_to = pad_to or round_up(rows_in(batch), self.num_devices)
                padded = parallel.same_on_every_process(pad_batch(batch, pad_to), parallel.batch_sharding(self.mesh))
                parts.append(self._eval_steps[key](self.state.train_state, *padded))
            self.state.eval_timestamp = self.state.eval_timestamp.to_next_batch(samples=rows_in(batch))
            self._fire(Event.EVAL_BATCH_END)
        if count == 0:
            raise ConfigurationError("eval_dataloader: yielded no examples")
        metrics = host.compute() if host is not None else compute_all(eval_metrics, sum_states(parts))
        metrics = {name: MetricValue(value) for name, value in metrics.items()}
        self.state.eval_metrics[label] = metrics
        self.logger.log_metrics({f"metrics/{label}/{k}": v for k, v in metrics.items()})
        self._fire(Event.EVAL_END)
        return metrics

    def predict(self, dataloader: Iterable, subset_num_batches: int = -1, return_outputs: bool = True):
        self._sync_model()
        dataloader, spec = self._unwrap(dataloader)
        fn = self._predict_fn(spec)
        # a torch model's outputs come back as torch tensors, as Composer's predict gives them
        adapter = adapters.model_adapter(self.task.source)
        to_user = (lambda x: adapter.from_array(None, x)) if adapter is not None else np.asarray
        outputs = []
        self.state.predict_timestamp = Timestamp()
        self._fire(Event.PREDICT_START)
        for i, raw in enumerate(dataloader):
            if subset_num_batches >= 0 and i >= subset_num_batches:
                break
            batch = as_batch(raw)
            self.state.batch = batch
            for event in (Event.PREDICT_BATCH_START, Event.PREDICT_BEFORE_FORWARD):
                self._fire(event)
            out = jax.tree.map(to_user, fn(self.state.train_state, batch))
            if return_outputs:
                outputs.append(out)
            self.state.predict_outputs = out
            self._fire(Event.PREDICT_AFTER_FORWARD)
            self.state.predict_timestamp = self.state.predict_timestamp.to_next_batch(samples=rows_in(batch))
            self._fire(Event.PREDICT_BATCH_END)
        self.state.predict_outputs = None
        self._fire(Event.PREDICT_END)
        return outputs

    def _predict_fn(self, spec: data_spec.DataSpec | None = None) -> Callable:
        key = data_spec.transform_key(spec)
        if key not in self._predict_steps:
            self._predict_steps[key] = collector_paused(jax.jit(steps.make_predict_step(
                self.task, self.composed, self.run_info, precision=self.precision,
                batch_transform=data_spec.whole_batch_transform(spec))))
        return self._predict_steps[key]

    def _run_eval(self, unit: TimeUnit | None) -> None:
        """Evaluate the sets due at this ``unit``'s boundary (``None``: every set with an interval, at the end of
        fit)."""
        due = [ev for ev in self._eval_sets
               if (ev.interval is not None if unit is None else self._due(ev.interval, unit))]
        if due:
            self.nonfinite_checks.check()  # an evaluation waits for the last step anyway: act on every flag first
            self._fire(Event.EVAL_BEFORE_ALL)
        for ev in due:
            with self._marker(f"eval/{ev.label}"):
                self._evaluate(ev.loader, ev.subset, ev.label, spec=ev.spec, metric_names=ev.metric_names)
        if due:
            self._fire(Event.EVAL_AFTER_ALL)
            self._last_eval_batch = self.state.timestamp.batch
