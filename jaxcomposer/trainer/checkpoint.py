"""Saving and restoring a run: the whole ``TrainState`` pytree (orbax) plus the host-side timestamp (JSON).

The data position needs no file of its own: it is a function of the timestamp (epoch, batch in epoch), because
loaders are deterministic per (seed, epoch) and resume by position. That is what makes a resumed run draw the same
batches and the same random keys (``fold_in(key, step)``) as an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxcomposer.core.time import Timestamp

STATE_DIR = "state"
META_FILE = "meta.json"


class CheckpointError(ValueError):
    pass


class CorruptCheckpointError(CheckpointError):
    """A saved file no longer matches the checksum written when its step was committed (bit rot, truncation)."""


CHECKSUMS = "checksums.json"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_checksums(step_dir: Path) -> None:
    """sha256 of every file of a committed step (orbax promises atomic commits, not bit integrity)."""
    files = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    table = {str(p.relative_to(step_dir)): _digest(p) for p in files}
    tmp = step_dir / (CHECKSUMS + ".tmp")
    tmp.write_text(json.dumps(table, indent=0))
    tmp.replace(step_dir / CHECKSUMS)  # atomic: a step has a complete table or none


def verify_checksums(step_dir: Path, step: int) -> None:
    table_path = step_dir / CHECKSUMS
    if not table_path.is_file():
        raise CorruptCheckpointError(f"checkpoint step {step} ({step_dir}) has no {CHECKSUMS}: its save never "
                                     "completed, so it is not trusted")
    for name, digest in json.loads(table_path.read_text()).items():
        path = step_dir / name
        if not path.is_file() or _digest(path) != digest:
            raise CorruptCheckpointError(f"checkpoint step {step}: file {path} is missing or does not match "
                                         "its checksum (corrupt or truncated)")


def save_checkpoint(path: str | Path, train_state: Any, timestamp: Timestamp, meta: dict | None = None) -> Path:
    """Write ``path/state`` (orbax, atomic: a torn save is never visible as complete) and ``path/meta.json``."""
    path = Path(path).absolute()  # orbax requires absolute paths (it fails late, in a background thread, otherwise)
    if (path / META_FILE).exists():
        raise CheckpointError(f"save_checkpoint: {path} already holds a checkpoint; choose a new path "
                              "(nothing saved is ever overwritten)")
    path.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path / STATE_DIR, train_state)
        ckptr.wait_until_finished()
    # meta.json last: its presence marks the checkpoint complete
    (path / META_FILE).write_text(json.dumps({"timestamp": timestamp.state_dict(), **(meta or {})}, indent=1))
    return path


def load_checkpoint(path: str | Path, target_state: Any) -> tuple[Any, Timestamp, dict]:
    """Restore onto ``target_state``'s structure, shapes, dtypes and shardings; raise clearly if it does not fit."""
    path = Path(path).absolute()
    if not (path / META_FILE).is_file() or not (path / STATE_DIR).is_dir():
        raise CheckpointError(f"load_path: {path} is not a complete jaxcomposer checkpoint "
                              f"(expected {STATE_DIR}/ and {META_FILE} inside it)")
    meta = json.loads((path / META_FILE).read_text())
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            restored = ckptr.restore(path / STATE_DIR, abstract)
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"load_path: {path} does not match this model/optimizer/recipe "
                              f"(changed shapes or methods?): {e}") from e
    return restored, Timestamp.from_state_dict(meta["timestamp"]), meta


class CheckpointStore:
    """Periodic checkpoints of a run in ``folder`` (Composer's ``save_folder``), one orbax step per saved batch.

    orbax's ``CheckpointManager`` gives atomic commits (a save killed midway stays a ``*.orbax-checkpoint-tmp``
    directory that is never listed, so it is never loaded), pruning to ``keep`` checkpoints and asynchronous
    writes; the timestamp and recipe travel in the same step as a JSON item.
    """

    def __init__(self, folder: str | Path, *, keep: int = -1, async_save: bool = True):
        self.folder = Path(folder).absolute()  # orbax needs absolute paths
        if keep == 0 or keep < -1:
            raise CheckpointError(f"save_num_checkpoints_to_keep: got {keep}, expected -1 (keep all) or >= 1")
        self._options = ocp.CheckpointManagerOptions(max_to_keep=None if keep == -1 else keep, create=False,
                                                     enable_async_checkpointing=async_save,
                                                     cleanup_tmp_directories=True)
        self._manager = None
        self._unsealed: list[int] = []  # committed (or committing) steps still waiting for their checksums

    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._manager is None:  # created lazily: a run that fails validation writes nothing
            self.folder.mkdir(parents=True, exist_ok=True)
            self._manager = ocp.CheckpointManager(self.folder, item_names=("state", "meta"), options=self._options)
        return self._manager

    def latest_step(self) -> int | None:
        if not self.folder.is_dir():
            return None
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return [] if not self.folder.is_dir() else list(self.manager.all_steps())

    def _seal(self) -> None:
        """Checksum the steps whose async writes have finished (orbax commits them atomically first)."""
        if not self._unsealed:
            return
        self.manager.wait_until_finished()
        for step in self._unsealed:
            step_dir = self.folder / str(step)
            if step_dir.is_dir():  # (max_to_keep may already have pruned it)
                write_checksums(step_dir)
        self._unsealed = []

    def newest_good_step(self) -> int | None:
        """The newest step whose files all match their checksums; corrupt ones are reported and passed over."""
        for step in sorted(self.all_steps(), reverse=True):
            try:
                verify_checksums(self.folder / str(step), step)
                return step
            except CorruptCheckpointError as e:
                warnings.warn(f"autoresume: skipping checkpoint step {step}: {e}", stacklevel=2)
        return None

    def save(self, step: int, train_state: Any, timestamp: Timestamp, meta: dict | None = None) -> None:
        self._seal()
        self._unsealed.append(step)
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(train_state),
            meta=ocp.args.JsonSave({"timestamp": timestamp.state_dict(), **(meta or {})})))

    def restore(self, step: int, target_state: Any) -> tuple[Any, Timestamp, dict]:
        verify_checksums(self.folder / str(step), step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target_state)
        try:
            out = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"checkpoint step {step} in {self.folder} does not match this model/optimizer/"
                                  f"recipe (changed shapes or methods?): {e}") from e
        return out["state"], Timestamp.from_state_dict(out["meta"]["timestamp"]), out["meta"]

    def wait(self) -> None:
        if self._manager is not None:
            self._seal()
            self._manager.wait_until_finished()

    def close(self) -> None:
        if self._manager is not None:
            self.wait()
            self._manager.close()
            self._manager = None
