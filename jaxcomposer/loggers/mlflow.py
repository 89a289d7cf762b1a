"""``MLFlowLogger``: metrics, hyperparameters and tags to an MLflow tracking store (Composer's ``MLFlowLogger``).

mlflow is an optional extra (``pip install jaxcomposer[mlflow]``), imported when the run starts. The logger talks to
the store through its own ``MlflowClient``, never through mlflow's module-level active run, so two Trainers (or a
notebook's earlier run) cannot write into each other's runs.

Where it writes: ``tracking_uri`` when given (a server, ``databricks``, a ``sqlite:///`` file), else the
``MLFLOW_TRACKING_URI`` environment variable, else a local SQLite store at ``<run_dir>/mlflow.db``, beside the run's
other logs. That is mlflow's own default backend since 3.7 (``sqlite:///mlflow.db`` in the working directory); its
``./mlruns`` file store is in maintenance mode and refused unless ``MLFLOW_ALLOW_FILE_STORE=true``. Read a run back
with ``mlflow.tracking.MlflowClient(tracking_uri)`` or ``mlflow ui --backend-store-uri <tracking_uri>``.

Differences from Composer's: system metrics (``log_system_metrics``, True in Composer), model registration and
artifact upload (``model_registry_prefix``, checkpoints as artifacts) are not offered; asking for system metrics is
refused rather than ignored.
"""
from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxcomposer.loggers.logger import FlushingDestination, PendingMetrics
from jaxcomposer.utils.extras import optional_import

__all__ = ["MLFlowLogger"]


def _mlflow():
    entities = optional_import("mlflow.entities", needed_by="MLFlowLogger", extra="mlflow", package="mlflow")
    tracking = optional_import("mlflow.tracking", needed_by="MLFlowLogger", extra="mlflow", package="mlflow")
    return tracking.MlflowClient, entities.Metric, entities.Param


class MLFlowLogger(FlushingDestination):
    """Log to MLflow, with Composer's argument names.

    Args:
        experiment_name: the MLflow experiment (created if missing); default ``MLFLOW_EXPERIMENT_NAME`` or
            ``'jaxcomposer'``.
        run_name: the MLflow run's name; default the Trainer's ``run_name``.
        tags: tags set on the run.
        tracking_uri: where the store is (see the module docstring for the default).
        rank_zero_only: log from process 0 only (every process logs with False).
        flush_interval: send buffered metrics every this many steps (also at each epoch end and at the end).
        log_system_metrics: must stay False (system metrics are not offered).
        ignore_metrics: glob patterns of metric names not to log (``'metrics/eval/*'``).
        ignore_hyperparameters: glob patterns of hyperparameter names not to log.
        run_group: set as the ``run_group`` tag, as Composer does.
        resume: continue the newest run of this experiment with the same run name (autoresume keeps one MLflow run).
    """

    def __init__(self, experiment_name: str | None = None, run_name: str | None = None,
                 tags: Mapping[str, Any] | None = None, tracking_uri: str | os.PathLike | None = None,
                 rank_zero_only: bool = True, flush_interval: int = 10, log_system_metrics: bool = False,
                 ignore_metrics: Sequence[str] | None = None, ignore_hyperparameters: Sequence[str] | None = None,
                 run_group: str | None = None, resume: bool = False):
        if log_system_metrics:
            raise ValueError("MLFlowLogger: log_system_metrics=True is not offered (it samples CPU and memory in a "
                             "background thread); use log_system_metrics=False")
        if not (isinstance(flush_interval, int) and flush_interval >= 1):
            raise ValueError(f"MLFlowLogger: flush_interval must be a positive number of steps, got {flush_interval!r}")
        for arg, patterns in (("ignore_metrics", ignore_metrics), ("ignore_hyperparameters", ignore_hyperparameters)):
            if patterns is not None and (isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns)):
                raise TypeError(f"MLFlowLogger: {arg} must be a list of glob patterns, got {patterns!r}")
        self.experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "jaxcomposer"
        self.run_name = run_name
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        if run_group is not None:
            self.tags["run_group"] = str(run_group)
        self.tracking_uri = os.fspath(tracking_uri) if tracking_uri is not None else None
        self.rank_zero_only = rank_zero_only
        self.flush_interval = flush_interval
        self.ignore_metrics = list(ignore_metrics or [])
        self.ignore_hyperparameters = list(ignore_hyperparameters or [])
        self.resume = resume
        self.run_id: str | None = None
        self._client = None
        self._pending = PendingMetrics()  # values the device may still be computing
        self._ready: list = []  # converted, waiting for the next flush
        self._params: dict[str, str] = {}  # logged before the run opened, or not yet sent
        self._last_flush_step = -1

    def resolved_tracking_uri(self, run_dir: str | os.PathLike | None) -> str:
        if self.tracking_uri is not None:
            return self.tracking_uri
        if os.environ.get("MLFLOW_TRACKING_URI"):
            return os.environ["MLFLOW_TRACKING_URI"]
        return "sqlite:///" + str(Path(run_dir if run_dir is not None else ".").resolve() / "mlflow.db")

    def fit_start(self, state, logger) -> None:
        if self._client is not None:
            return
        import jax
        if self.rank_zero_only and jax.process_index() != 0:
            return
        MlflowClient, _, _ = _mlflow()
        self.tracking_uri = self.resolved_tracking_uri(getattr(state, "run_dir", None))
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment = self._client.get_experiment_by_name(self.experiment_name)
        experiment_id = experiment.experiment_id if experiment is not None else \
            self._client.create_experiment(self.experiment_name)
        name = self.run_name or getattr(state, "run_name", None) or "jaxcomposer"
        self.run_id = self._find_run(experiment_id, name) if self.resume else None
        if self.run_id is None:
            self.run_id = self._client.create_run(experiment_id, run_name=name, tags=self.tags).info.run_id
        else:  # reopened: mark it running again
            self._client.update_run(self.run_id, status="RUNNING")
        self._send_params()

    def _find_run(self, experiment_id: str, name: str) -> str | None:
        quoted = name.replace("'", "\\'")
        runs = self._client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{quoted}'",
                                        order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None

    # -- values -------------------------------------------------------------------------------------------------
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        if self._client is None:  # not open (another process than rank 0, or before fit)
            return
        kept = {k: v for k, v in metrics.items() if not _matches(k, self.ignore_metrics)}
        if kept:
            self._pending.push(step, kept)
        self._ready += self._pending.pop()
        if step - self._last_flush_step >= self.flush_interval:
            self.flush(wait=False)
            self._last_flush_step = step

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        for k, v in hparams.items():
            if not _matches(str(k), self.ignore_hyperparameters):
                self._params[str(k)] = str(v)[:6000]  # mlflow's limit on a param value
        self._send_params()

    def _send_params(self) -> None:
        if self._client is None or not self._params:
            return
        _, _, Param = _mlflow()
        existing = self._client.get_run(self.run_id).data.params
        # a param is immutable in MLflow: a resumed run keeps the first value, and a changed one goes to a tag
        new = [Param(k, v) for k, v in self._params.items() if k not in existing]
        changed = {k: v for k, v in self._params.items() if k in existing and existing[k] != v}
        if new:
            self._client.log_batch(self.run_id, params=new)
        for k, v in changed.items():
            self._client.set_tag(self.run_id, f"param_changed.{k}", v)
        self._params = {}

    def flush(self, wait: bool = True) -> None:
        """Send what is ready; with ``wait``, first wait for every value still computing."""
        if self._client is None:
            return
        if wait:
            self._ready += self._pending.pop(force=True)
        records, self._ready = self._ready, []
        _, Metric, _ = _mlflow()
        now = int(time.time() * 1000)
        batch = [Metric(name, value, now, r.step) for r in records for name, value in r.metrics.items()]
        for i in range(0, len(batch), 1000):  # the store's limit per call
            self._client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    def close(self, state, logger) -> None:
        if self._client is None:
            return
        self.flush()
        self._client.set_terminated(self.run_id, status="FINISHED")
        self._client = None


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
