"""``WandBLogger``: metrics and hyperparameters to Weights & Biases (Composer's ``WandBLogger``).

wandb is an optional extra (``pip install jaxcomposer[wandb]``), imported when the run starts. Unlike Composer's,
the run is **offline by default**: it writes ``<dir>/wandb/offline-run-*`` (``dir`` defaults to the run directory)
and never touches the network or asks for an account; upload it later with ``wandb sync``. ``init_kwargs={'mode':
'online'}`` or ``WANDB_MODE=online`` gives Composer's behaviour. The logger keeps the ``wandb.Run`` that
``wandb.init`` returns and logs through it, so several Trainers in one process write to their own runs.

Not offered: ``log_artifacts=True`` (uploading checkpoints as artifacts), which is refused when asked for.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from jaxcomposer.loggers.logger import FlushingDestination, PendingMetrics
from jaxcomposer.utils.extras import optional_import

__all__ = ["WandBLogger"]


class WandBLogger(FlushingDestination):
    """Log to Weights & Biases, with Composer's argument names.

    Args:
        project, group, name, entity, tags: passed to ``wandb.init``; ``name`` defaults to the Trainer's
            ``run_name``.
        log_artifacts: must stay False (checkpoint upload is not offered).
        rank_zero_only: log from process 0 only.
        init_kwargs: any other ``wandb.init`` arguments (``mode``, ``dir``, ``id``, ``resume``, ``config``, ...);
            ``mode`` defaults to ``WANDB_MODE`` or ``'offline'``, ``dir`` to the run directory.
    """

    def __init__(self, project: str | None = None, group: str | None = None, name: str | None = None,
                 entity: str | None = None, tags: Sequence[str] | None = None, log_artifacts: bool = False,
                 rank_zero_only: bool = True, init_kwargs: Mapping[str, Any] | None = None):
        if log_artifacts:
            raise ValueError("WandBLogger: log_artifacts=True (uploading checkpoints as W&B artifacts) is not "
                             "offered; checkpoints stay in save_folder. Use log_artifacts=False.")
        if init_kwargs is not None and not isinstance(init_kwargs, Mapping):
            raise TypeError(f"WandBLogger: init_kwargs must be a dict of wandb.init arguments, got {init_kwargs!r}")
        clash = {"project", "group", "name", "entity", "tags"} & set(init_kwargs or {})
        if clash:
            raise ValueError(f"WandBLogger: {sorted(clash)} given both as arguments and in init_kwargs; pass each once")
        self.init_kwargs = {k: v for k, v in dict(project=project, group=group, name=name, entity=entity,
                                                  tags=list(tags) if tags else None).items() if v is not None}
        self.init_kwargs.update(init_kwargs or {})
        self.rank_zero_only = rank_zero_only
        self.run = None
        self._pending = PendingMetrics()
        self._config: dict[str, Any] = {}  # logged before the run opened

    def fit_start(self, state, logger) -> None:
        if self.run is not None:
            return
        import jax
        if self.rank_zero_only and jax.process_index() != 0:
            return
        wandb = optional_import("wandb", needed_by="WandBLogger", extra="wandb", package="wandb")
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("name", getattr(state, "run_name", None))
        kwargs.setdefault("mode", os.environ.get("WANDB_MODE") or "offline")
        run_dir = getattr(state, "run_dir", None)
        if run_dir is not None:
            os.makedirs(run_dir, exist_ok=True)
            kwargs.setdefault("dir", os.fspath(run_dir))
        kwargs.setdefault("reinit", "create_new")  # its own run, whatever wandb.run another caller opened
        self.run = wandb.init(**kwargs)
        if self._config:
            self.run.config.update(self._config, allow_val_change=True)

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        self._config.update(hparams)
        if self.run is not None:
            self.run.config.update(dict(hparams), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        if self.run is None:
            return
        self._pending.push(step, metrics)
        self._write(self._pending.pop())

    def _write(self, records) -> None:
        for r in records:
            self.run.log(r.metrics, step=r.step)

    def flush(self) -> None:
        if self.run is not None:
            self._write(self._pending.pop(force=True))

    def close(self, state, logger) -> None:
        if self.run is None:
            return
        self.flush()
        self.run.finish()
        self.run = None
