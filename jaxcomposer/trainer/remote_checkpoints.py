"""Checkpoints in an object store: ``save_folder`` and ``load_path`` as ``s3://bucket/prefix`` or ``gs://...``.

Each save is first a local one (:class:`~jaxcomposer.trainer.checkpoint.CheckpointStore` in a staging folder:
orbax's atomic commit, the checksum table), then a background thread uploads it, so training waits on the network
only when the next save comes before the upload is done (at most one save in flight, one step staged at a time).
In the bucket, below the folder:

- ``<step>/...``: the step's files, as in a local ``save_folder``, then ``<step>/checksums.json`` (their sha256);
  each object's bytes are checked by the server against the SHA-256 the client sends with it;
- ``<step>/COMMITTED``, written last and only if absent, once every object is listed with its local size: a step
  without it is never read (autoresume and ``load_path`` pass over a save cut short, as over a torn local one);
- Composer's names (``ep1-ba4-rank0.pt``, ``latest-rank0.pt``): small objects naming their step, written after the
  commit, so a name never points at a torn save.

Old steps (``save_num_checkpoints_to_keep``, ``save_overwrite``) are deleted only after the new step is committed,
their marker first. A step read back is downloaded into the staging folder and verified against its checksum
table before anything is restored from it; one that fails is reported and passed over.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np

from jaxcomposer.core.state import TrainState
from jaxcomposer.core.time import Timestamp
from jaxcomposer.errors import CheckpointError, CorruptCheckpointError, ObjectStoreError
from jaxcomposer.trainer import checkpoint, flat_arrays
from jaxcomposer.utils.object_store import RemoteFolder, staging_root

COMMIT = "COMMITTED"
UPLOAD_THREADS = 8  # a step's files move side by side: for small objects a request's latency is the bound


def _new_staging_dir(uri: str) -> Path:
    root = staging_root()
    tag = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=root))


def committed_steps(remote: RemoteFolder) -> list[int]:
    """The steps below ``remote`` whose commit marker is there, oldest first."""
    steps = []
    for key in remote.list():
        head, _, tail = key.partition("/")
        if tail == COMMIT and head.isdigit():
            steps.append(int(head))
    return sorted(steps)


def download_step(remote: RemoteFolder, step: int, into: Path) -> Path:
    """Step ``step`` of ``remote`` as a verified local checkpoint directory ``into/<step>`` (downloaded unless a
    verified copy is there). Raises CorruptCheckpointError when its files do not match its checksum table."""
    local = into / str(step)
    try:
        checkpoint.verify_checksums(local, step)
        return local
    except CorruptCheckpointError:
        shutil.rmtree(local, ignore_errors=True)
    listed = remote.list(f"{step}/")
    if f"{step}/{COMMIT}" not in listed:
        raise CorruptCheckpointError(f"checkpoint step {step} in {remote.uri} has no {COMMIT} marker: its upload "
                                     "never completed, so it is not trusted")
    partial = into / f".{step}.download"
    shutil.rmtree(partial, ignore_errors=True)
    keys = [key for key in listed if key != f"{step}/{COMMIT}"]
    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(lambda key: remote.get_file(key, partial / key.split("/", 1)[1]), keys))
    checkpoint.verify_checksums(partial, step)  # raises CorruptCheckpointError naming the file
    partial.rename(local)
    return local


def _pointer(step: int) -> bytes:
    return json.dumps({"step": step}).encode()


class RemoteCheckpointStore:
    """Periodic checkpoints of a run in an object-store folder; the interface of
    :class:`~jaxcomposer.trainer.checkpoint.CheckpointStore` (``save``, ``wait``, ``close``, ``latest_step``,
    ``all_steps``, ``newest_good_step``, ``restore``, ``location``)."""

    def __init__(self, uri: str, *, keep: int = -1, overwrite: bool = False, weights_only: bool = False,
                 filename: str | None = checkpoint.SAVE_FILENAME,
                 latest_filename: str | None = checkpoint.SAVE_LATEST_FILENAME, run_name: str | None = None,
                 small_state_bytes: int | None = None):
        if keep == 0 or keep < -1:
            raise CheckpointError(f"save_num_checkpoints_to_keep: got {keep}, expected -1 (keep all) or >= 1")
        checkpoint.check_name_pattern(filename, "save_filename")
        checkpoint.check_name_pattern(latest_filename, "save_latest_filename")
        self.remote = RemoteFolder(uri, "save_folder")
        self.folder = self.remote.uri
        self.keep, self.weights_only = keep, weights_only
        self.filename, self.latest_filename, self.run_name = filename, latest_filename, run_name
        self._stale = set(committed_steps(self.remote)) if overwrite else set()
        self._small_state_bytes = small_state_bytes
        self._local: checkpoint.CheckpointStore | None = None  # the staging store, made at the first save
        self._staging: Path | None = None
        self._upload: threading.Thread | None = None
        self._upload_error: BaseException | None = None

    # ---- reading ----
    def location(self, step: int) -> str:
        return f"{self.folder}/{step}"

    def all_steps(self) -> list[int]:
        return committed_steps(self.remote)

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def newest_good_step(self) -> int | None:
        """The newest committed step whose files match their checksums (downloaded into the staging folder);
        others are reported and passed over."""
        for step in reversed(self.all_steps()):
            try:
                download_step(self.remote, step, self.staging)
                return step
            except CorruptCheckpointError as e:  # (a bucket that cannot be read raises: that is no torn step)
                warnings.warn(f"autoresume: skipping checkpoint step {step}: {e}", stacklevel=2)
        return None

    def restore(self, step: int, target_state: TrainState, **kw) -> tuple[TrainState, Timestamp | None, dict]:
        local = download_step(self.remote, step, self.staging)
        return checkpoint.restore(local, target_state, label=f"checkpoint step {step} in {self.folder}", **kw)

    @property
    def staging(self) -> Path:
        if self._staging is None:
            self._staging = _new_staging_dir(self.folder)
            # also without close(): the staged copy goes when the store does, or when the interpreter exits
            weakref.finalize(self, shutil.rmtree, self._staging, True)
        return self._staging

    # ---- writing ----
    def save(self, step: int, train_state: TrainState, timestamp: Timestamp, meta: dict | None = None) -> None:
        self._finish_upload()  # at most one save in flight; an upload that failed is raised here
        if jax.process_count() > 1:
            self._save_gathered(step, train_state, timestamp, meta)
            return
        if self._local is None:
            kw = {} if self._small_state_bytes is None else {"small_state_bytes": self._small_state_bytes}
            self._local = checkpoint.CheckpointStore(self.staging, keep=1, weights_only=self.weights_only,
                                                     filename=None, latest_filename=None, run_name=self.run_name,
                                                     **kw)
        self._local.save(step, train_state, timestamp, meta)  # returns once the state is copied to the host
        self._start_upload(step, timestamp, self._local.folder / str(step), wait_for=self._local.wait)

    def _save_gathered(self, step: int, train_state: TrainState, timestamp: Timestamp, meta: dict | None) -> None:
        """Several processes: every process takes part in gathering the state whole onto the hosts (a collective,
        at the same step everywhere), and process 0 alone writes it as ``.npz`` items and uploads it, so one process
        commits the step, and the checkpoint restores on any number of processes. The whole state passes through
        every host's memory: a sharded model larger than a host's memory cannot be saved to a bucket this way."""
        from jax.experimental import multihost_utils

        items = {name: {path: np.asarray(multihost_utils.process_allgather(x, tiled=True))
                        for path, x in checkpoint.flat_paths(tree).items()}
                 for name, tree in checkpoint.split_state(train_state, self.weights_only).items()}
        if jax.process_index() != 0:
            return
        local, partial = self.staging / str(step), self.staging / f".{step}.partial"
        for old in (local, partial):
            shutil.rmtree(old, ignore_errors=True)
        partial.mkdir(parents=True)
        for name, arrays in items.items():
            (partial / name).mkdir()
            flat_arrays.write(partial / name / flat_arrays.FILE, arrays)
        (partial / checkpoint.META_FILE).write_text(json.dumps(
            {"timestamp": timestamp.state_dict(), "weights_only": self.weights_only, **(meta or {})}, indent=1))
        checkpoint.write_checksums(partial)
        partial.rename(local)
        self._start_upload(step, timestamp, local, wait_for=lambda: None)
        for old in self.staging.iterdir():  # one staged step at a time, as the local store keeps
            if old.name.isdigit() and int(old.name) < step:
                shutil.rmtree(old, ignore_errors=True)

    def _start_upload(self, step: int, timestamp: Timestamp, local: Path, wait_for) -> None:
        self._upload = threading.Thread(target=self._upload_step, args=(step, timestamp, local, wait_for),
                                        name=f"jaxcomposer-upload-{step}", daemon=True)
        self._upload.start()

    def _upload_step(self, step: int, timestamp: Timestamp, local: Path, wait_for) -> None:
        try:
            wait_for()  # the local commit and its checksum table
            checkpoint.verify_checksums(local, step)
            files = {str(p.relative_to(local)): p for p in sorted(local.rglob("*")) if p.is_file()}
            # a copy of this step already in the bucket was passed over (torn, or corrupt: autoresume took an
            # older step): it stops counting before it is replaced, and what the new copy lacks goes
            self.remote.delete([f"{step}/{COMMIT}"])
            # the files side by side, the checksum table after them
            table = files.pop(checkpoint.CHECKSUMS)
            with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
                list(pool.map(lambda item: self.remote.put_file(f"{step}/{item[0]}", item[1]), files.items()))
            self.remote.put_file(f"{step}/{checkpoint.CHECKSUMS}", table)
            files[checkpoint.CHECKSUMS] = table
            listed = self.remote.list(f"{step}/")
            self.remote.delete([key for key in listed if key.split("/", 1)[1] not in files])
            short = [rel for rel, path in files.items() if listed.get(f"{step}/{rel}") != path.stat().st_size]
            if short:
                raise ObjectStoreError(f"upload to {self.location(step)}: {short} are missing or of another size "
                                       "in the bucket after their upload")
            table = (local / checkpoint.CHECKSUMS).read_bytes()
            marker = json.dumps({"step": step, "checksums_sha256": hashlib.sha256(table).hexdigest()}).encode()
            if not self.remote.put_bytes(f"{step}/{COMMIT}", marker, create=True):
                raise CheckpointError(f"{self.location(step)} is committed already (another run saving to the "
                                      "same folder?); it was left as it was")
            self._name(step, timestamp)
            self._prune(step)
        except BaseException as e:  # raised in the training thread at the next save or wait
            self._upload_error = e

    def _name(self, step: int, timestamp: Timestamp) -> None:
        """Composer's names for the committed step: small objects that name it (``{"step": 4}``)."""
        for pattern in (self.filename, self.latest_filename):
            if pattern is not None:
                self.remote.put_bytes(checkpoint.format_name(pattern, timestamp, self.run_name), _pointer(step))

    def _prune(self, newest: int) -> None:
        """After ``newest`` is committed: the run's stale steps (``overwrite``) and those past ``keep``, each
        marker first (a half-deleted step is never taken for a checkpoint), then the names that pointed at them."""
        steps = [s for s in committed_steps(self.remote) if s != newest]
        doomed = set(self._stale)
        if self.keep != -1:
            doomed.update(steps[:max(0, len(steps) - (self.keep - 1))])
        doomed.discard(newest)
        if not doomed:
            return
        for step in sorted(doomed):
            self.remote.delete([f"{step}/{COMMIT}"])
            self.remote.delete([k for k in self.remote.list(f"{step}/")])
        self._stale = set()
        for key, size in self.remote.list().items():
            if "/" not in key and size < 256 and not key.isdigit():
                try:
                    if json.loads(self.remote.get_bytes(key) or b"{}").get("step") in doomed:
                        self.remote.delete([key])
                except (ValueError, AttributeError):
                    pass

    def _finish_upload(self) -> None:
        if self._upload is not None:
            self._upload.join()
            self._upload = None
        if self._upload_error is not None:
            error, self._upload_error = self._upload_error, None
            if isinstance(error, (CheckpointError, OSError)):
                raise ObjectStoreError(f"saving to {self.folder} failed; the checkpoints committed before it are "
                                       f"untouched: {error}") from error
            raise error

    def wait(self) -> None:
        self._finish_upload()

    def close(self) -> None:
        try:
            self._finish_upload()
        finally:
            if self._local is not None:
                self._local.close()
                self._local = None
            if self._staging is not None:
                shutil.rmtree(self._staging, ignore_errors=True)
                self._staging = None


def resolve_remote_load_path(uri: str) -> Path:
    """``load_path`` in an object store: a step folder (``.../12``), one of Composer's names
    (``.../latest-rank0.pt``), or a save folder (its newest verified step), downloaded into a staging folder and
    verified; the local checkpoint directory."""
    parent, _, last = uri.rstrip("/").rpartition("/")
    candidates = []
    if last.isdigit() and "://" in parent:
        candidates.append((RemoteFolder(parent, "load_path"), int(last)))
    elif "://" in parent and "." in last:
        folder = RemoteFolder(parent, "load_path")
        pointer = folder.get_bytes(last)
        if pointer is not None:
            try:
                candidates.append((folder, int(json.loads(pointer)["step"])))
            except (ValueError, KeyError, TypeError):
                raise CheckpointError(f"load_path: {uri} is not one of jaxcomposer's checkpoint names") from None
    if not candidates:
        folder = RemoteFolder(uri, "load_path")
        candidates = [(folder, s) for s in reversed(committed_steps(folder))]
        if not candidates:
            raise CheckpointError(f"load_path: {uri} holds no committed checkpoint (nor is it a step or a "
                                  "checkpoint name)")
    for folder, step in candidates:
        try:
            return download_step(folder, step, _new_staging_dir(uri))
        except CorruptCheckpointError as e:
            if len(candidates) == 1:
                raise
            warnings.warn(f"load_path: skipping checkpoint step {step}: {e}", stacklevel=2)
    raise CheckpointError(f"load_path: {uri} holds no checkpoint that passes its checksums")
