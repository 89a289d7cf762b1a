"""``CheckpointSaver``: Composer's checkpointing callback, on the Trainer's own verified orbax store.

The Trainer's ``save_folder``/``save_interval``/``save_filename``/... arguments save through the same store; this
callback is for scripts that pass Composer's ``CheckpointSaver(...)`` in ``callbacks=`` (several savers, or one
configured apart from the Trainer). Checkpoints are the same as the Trainer's: atomic, checksummed step directories
under ``folder``, Composer's names linking to them once committed, ``load_path`` taking either.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from jaxcomposer.core.events import Callback, Event
from jaxcomposer.core.time import TimeUnit

__all__ = ["CheckpointSaver"]


class CheckpointSaver(Callback):
    """Composer's ``CheckpointSaver(folder='{run_name}/checkpoints', filename='ep{epoch}-ba{batch}-rank{rank}.pt',
    remote_file_name=None, latest_filename='latest-rank{rank}.pt', latest_remote_file_name=None, save_interval='1ep',
    *, overwrite=False, num_checkpoints_to_keep=-1, weights_only=False, ignore_keys=None)``.

    ``save_interval``: ``'Nep'``, ``'Nba'``, an int of epochs, or Composer's ``(state, event) -> bool`` asked at each
    batch and epoch end; the end of training is always saved, as the Trainer's. ``folder`` may name ``{run_name}``.
    ``folder`` may be an object store (``s3://bucket/prefix``, ``gs://...``): the Trainer's remote store, with
    the same guarantees as its ``save_folder``. Composer's ``remote_file_name`` (an upload of each checkpoint file
    through a ``RemoteUploaderDownloader``) is refused in favour of that: a checkpoint here is a folder, committed
    in the bucket only when complete. ``ignore_keys`` (Composer's: keys left out of the saved state) is refused;
    save everything and use ``load_ignore_keys`` when loading.
    """

    # it saves state.train_state at a batch's end, which must be that batch's: the Trainer refuses it with
    # steps_per_execution > 1 (a call's callbacks see the state after its last batch)
    needs_each_batch_state = True

    def __init__(self, folder: str | Path = "{run_name}/checkpoints",
                 filename: str = "ep{epoch}-ba{batch}-rank{rank}.pt", remote_file_name: str | None = None,
                 latest_filename: str | None = "latest-rank{rank}.pt",
                 latest_remote_file_name: str | None = None, save_interval: Any = "1ep", *, overwrite: bool = False,
                 num_checkpoints_to_keep: int = -1, weights_only: bool = False, ignore_keys: Any = None):
        from jaxcomposer import options  # (options imports core modules: imported here, not at the top)

        for name, value in (("remote_file_name", remote_file_name), ("latest_remote_file_name",
                                                                     latest_remote_file_name),
                            ("ignore_keys", ignore_keys)):
            if value is not None:
                raise ValueError(f"CheckpointSaver: {name}={value!r} is not supported (for a bucket, give folder="
                                 f"'s3://bucket/prefix'; ignore keys when loading, with load_ignore_keys); pass "
                                 f"{name}=None")
        self.folder, self.filename, self.latest_filename = str(folder), filename, latest_filename
        self.interval: Callable | Any = save_interval if callable(save_interval) else \
            options.parse_interval(save_interval, "CheckpointSaver(save_interval)")
        self.overwrite, self.keep, self.weights_only = bool(overwrite), int(num_checkpoints_to_keep), bool(weights_only)
        self.store = None
        self.saved: list[int] = []  # the batches saved

    def init(self, state, logger) -> None:
        from jaxcomposer.errors import ConfigurationError
        from jaxcomposer.trainer import checkpoint  # (the trainer package imports jaxcomposer.callbacks)

        folder = self.folder.replace("{run_name}", state.run_name)
        try:
            self.store = checkpoint.open_store(folder, keep=self.keep, overwrite=self.overwrite,
                                               weights_only=self.weights_only, filename=self.filename,
                                               latest_filename=self.latest_filename, run_name=state.run_name)
        except checkpoint.CheckpointError as e:
            raise ConfigurationError(f"CheckpointSaver: {e}") from e
        if self.store.latest_step() is not None and not self.overwrite:
            raise ConfigurationError(f"CheckpointSaver: {self.store.folder} already holds checkpoints; pass "
                                     "overwrite=True to replace them, or choose a new folder")

    def _due(self, state, unit: TimeUnit, event: Event) -> bool:
        if callable(self.interval):
            return bool(self.interval(state, event))
        if self.interval is None or self.interval.unit != unit:
            return False
        return int(state.timestamp.get(unit).value) % self.interval.value == 0

    def _save(self, state) -> None:
        batch = int(state.timestamp.batch)
        if self.store is None or (self.saved and self.saved[-1] == batch):
            return
        meta = {"run_name": state.run_name, "seed": state.seed}
        self.store.save(batch, state.train_state, state.timestamp, meta)
        self.saved.append(batch)

    def batch_end(self, state, logger) -> None:
        if self._due(state, TimeUnit.BATCH, Event.BATCH_END):
            self._save(state)

    def epoch_end(self, state, logger) -> None:
        if self._due(state, TimeUnit.EPOCH, Event.EPOCH_END):
            self._save(state)

    def fit_end(self, state, logger) -> None:
        self._save(state)  # the end of training is always saved
        self.store.wait()

    def close(self, state, logger) -> None:
        if self.store is not None:
            self.store.close()
