"""Saving and restoring a run: the ``TrainState`` pytree (orbax; small states as ``.npz`` items, see
``flat_arrays``) plus the host-side timestamp (JSON).

A checkpoint directory holds three items: ``weights`` (params and model state), ``train`` (step, optimizer state,
method extras such as EMA, RNG key; absent when saved with ``weights_only``) and the ``meta`` JSON (timestamp,
run name, recipe), plus ``checksums.json``. Splitting weights from the rest is what makes ``load_weights_only``
(fine-tuning with another optimizer) a plain restore of one item.

The data position needs no item of its own: it is a function of the timestamp (epoch, batch in epoch), because
loaders are deterministic per (seed, epoch) and resume by position. That is what makes a resumed run draw the same
batches and the same random keys (``fold_in(key, step)``) as an uninterrupted one.

Restoring reads each item's saved shapes from its metadata, restores them as they were saved (replicated over the
target's mesh, so a checkpoint written on 8 devices loads on 1), and then matches leaves to the target by dotted
path (``params.head.kernel``). A mismatch names every differing path and both shapes instead of orbax's tree
diff, and ``ignore_keys`` (globs on those paths) keeps chosen leaves as freshly initialised.
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jaxcomposer import parallel
from jaxcomposer.core.state import TrainState
from jaxcomposer.core.time import Timestamp
from jaxcomposer.errors import CheckpointError, ConfigurationError, CorruptCheckpointError
from jaxcomposer.trainer import flat_arrays
from jaxcomposer.utils.object_store import is_uri

WEIGHTS, TRAIN, META = "weights", "train", "meta"
WEIGHT_FIELDS = ("params", "model_state")
TRAIN_FIELDS = ("step", "opt_state", "extras", "key")
META_FILE = "meta.json"  # single-directory checkpoints; CheckpointManager steps keep it as ``meta/metadata``
CHECKSUMS = "checksums.json"
_TMP = ".orbax-checkpoint-tmp"




# ---- integrity -------------------------------------------------------------------------------------------------
def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# orbax rewrites these at the step root while committing, after our checksums are written; they hold save times,
# not training state (each item keeps its own metadata files, which are checksummed)
_STEP_BOOKKEEPING = {CHECKSUMS, CHECKSUMS + ".tmp", "_CHECKPOINT_METADATA", "commit_success.txt"}


def write_checksums(step_dir: Path) -> None:
    """sha256 of every file of a step (orbax promises atomic commits, not bit integrity)."""
    files = sorted(p for p in step_dir.rglob("*")
                   if p.is_file() and not (p.parent == step_dir and p.name in _STEP_BOOKKEEPING))
    table = {str(p.relative_to(step_dir)): _digest(p) for p in files}
    tmp = step_dir / (CHECKSUMS + ".tmp")
    tmp.write_text(json.dumps(table, indent=0))
    tmp.replace(step_dir / CHECKSUMS)  # atomic: a step has a complete table or none


def verify_checksums(step_dir: Path, step: int | str) -> None:
    table_path = step_dir / CHECKSUMS
    if not table_path.is_file():
        raise CorruptCheckpointError(f"checkpoint step {step} ({step_dir}) has no {CHECKSUMS}: its save never "
                                     "completed, so it is not trusted")
    for name, digest in json.loads(table_path.read_text()).items():
        path = step_dir / name
        if not path.is_file() or _digest(path) != digest:
            raise CorruptCheckpointError(f"checkpoint step {step}: file {path} is missing or does not match "
                                         "its checksum (corrupt or truncated)")


# ---- the pytree <-> items split ---------------------------------------------------------------------------------
def split_state(state: TrainState, weights_only: bool = False) -> dict[str, dict]:
    items = {WEIGHTS: {f: getattr(state, f) for f in WEIGHT_FIELDS}}
    if not weights_only:
        items[TRAIN] = {f: getattr(state, f) for f in TRAIN_FIELDS}
    return items


def _path_name(path) -> str:
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    if len(parts) > 1 and parts[-1] == "value":  # an NNX Variable's payload: params.head.kernel, not ...kernel.value
        parts.pop()
    return ".".join(parts)


def flat_paths(tree) -> dict[str, Any]:
    """``{dotted path: leaf}``; the names ``load_ignore_keys`` globs match (``params.head.kernel``, ``opt_state.*``)."""
    return {_path_name(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _describe_leaf(x) -> str:
    return f"{tuple(x.shape)} {x.dtype}"


class _NoStepMetadataNotice(logging.Filter):
    # An item inside a CheckpointManager step has no step-level metadata file of its own; orbax logs that as a
    # warning on every restore, which would read like a problem to users
    def filter(self, record: logging.LogRecord) -> bool:
        return "Metadata file does not exist" not in record.getMessage()


class _Layout:
    """Where each restored array goes: the target's own sharding for a leaf of the same path and shape (so a
    checkpoint written on 8 devices, or on a mesh of another shape, is read straight into this run's layout), and
    replicated over the target's mesh otherwise (a mismatch that ``merge_into`` then reports)."""

    def __init__(self, target):
        self.by_name = {name: (tuple(x.shape), x.sharding) for name, x in flat_paths(target).items()}
        first = jax.tree_util.tree_leaves(target)[0].sharding
        mesh = getattr(first, "mesh", None)
        self.fallback = NamedSharding(mesh, PartitionSpec()) if mesh is not None else first

    def __call__(self, name: str, shape) -> Any:
        known = self.by_name.get(name)
        return known[1] if known is not None and known[0] == tuple(shape) else self.fallback


def _restore_item(item_dir: Path, layout: _Layout) -> dict[str, Any]:
    """Restore an item as it was saved (shapes from its metadata), every array placed as ``layout`` says."""
    if flat_arrays.is_flat_item(item_dir):
        return {name: parallel.same_on_every_process(x, layout(name, x.shape))
                for name, x in flat_arrays.read(item_dir / flat_arrays.FILE).items()}
    quiet = _NoStepMetadataNotice()
    logging.getLogger("absl").addFilter(quiet)
    try:
        return _restore_item_quietly(item_dir, layout)
    finally:
        logging.getLogger("absl").removeFilter(quiet)


def _restore_item_quietly(item_dir: Path, layout: _Layout) -> dict[str, Any]:
    with ocp.StandardCheckpointer() as ckptr:
        metadata = ckptr.metadata(item_dir)
        tree = getattr(metadata, "item_metadata", metadata)
        abstract = jax.tree_util.tree_map_with_path(
            lambda path, m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=layout(_path_name(path), m.shape)), tree)
        return flat_paths(ckptr.restore(item_dir, abstract))


def merge_into(target: TrainState, saved: dict[str, Any], *, fields: Sequence[str], ignore_keys: Sequence[str],
               where: str) -> TrainState:
    """Leaves of ``target`` under ``fields`` replaced by ``saved`` ones of the same path; every other leaf, and
    those matching ``ignore_keys``, keep the target's value. Raises listing every mismatch."""
    ignored = lambda p: any(fnmatch.fnmatchcase(p, pat) for pat in ignore_keys)
    in_scope = lambda p: p.split(".", 1)[0] in fields
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(target)
    names = [_path_name(path) for path, _ in leaves_with_paths] + list(saved)
    unmatched = [pat for pat in ignore_keys if not any(fnmatch.fnmatchcase(n, pat) for n in names)]
    if unmatched:  # a typo in a glob would otherwise silently load what the user meant to skip
        raise CheckpointError(f"load_ignore_keys: {unmatched} match no leaf of {where} or of this model/recipe; "
                              f"paths look like {names[:3]} (globs on dotted paths, e.g. 'params.head.*')")
    new_leaves, problems, used = [], [], set()
    for path, leaf in leaves_with_paths:
        name = _path_name(path)
        if not in_scope(name) or ignored(name):
            new_leaves.append(leaf)
            continue
        got = saved.get(name)
        if got is None:
            problems.append(f"{name}: in the model/recipe but not in the checkpoint")
        elif got.shape != leaf.shape or got.dtype != leaf.dtype:
            problems.append(f"{name}: checkpoint has {_describe_leaf(got)}, "
                            f"the model/recipe has {_describe_leaf(leaf)}")
        used.add(name)
        new_leaves.append(got if got is not None else leaf)
    problems += [f"{name}: in the checkpoint but not in the model/recipe" for name in sorted(saved)
                 if name not in used and in_scope(name) and not ignored(name)]
    if problems:
        shown = "\n  ".join(problems[:12]) + (f"\n  ... and {len(problems) - 12} more" if len(problems) > 12 else "")
        raise CheckpointError(
            f"{where} does not match this model/optimizer/recipe ({len(problems)} differences):\n  {shown}\n"
            "Restore the same model and recipe, pass load_weights_only=True to take only the weights, or skip "
            "leaves with load_ignore_keys=['params.head.*', ...] (globs on the paths above).")
    return jax.tree_util.tree_unflatten(treedef, new_leaves)


def _read_meta(step_dir: Path) -> dict:
    for candidate in (step_dir / META_FILE, step_dir / META / "metadata"):
        if candidate.is_file():
            return json.loads(candidate.read_text())
    raise CheckpointError(f"{step_dir} has no {META_FILE}: not a jaxcomposer checkpoint")


def is_checkpoint_dir(path: Path) -> bool:
    return (path / WEIGHTS).is_dir() and ((path / META_FILE).is_file() or (path / META / "metadata").is_file())


def restore(step_dir: Path, target: TrainState, *, weights_only: bool = False, ignore_keys: Sequence[str] = (),
            label: str | None = None) -> tuple[TrainState, Timestamp | None, dict]:
    """Restore a checkpoint directory onto ``target``; verified first. ``weights_only`` takes params and model
    state and returns no timestamp (training starts at batch 0, as Composer's ``load_weights_only``)."""
    label = label or f"checkpoint {step_dir}"
    verify_checksums(step_dir, step_dir.name)
    meta = _read_meta(step_dir)
    if not weights_only and not (step_dir / TRAIN).is_dir():
        raise CheckpointError(f"{label} holds weights only (saved with save_weights_only=True), so training "
                              "cannot continue from it; pass load_weights_only=True to start from its weights")
    layout = _Layout(target)
    saved = _restore_item(step_dir / WEIGHTS, layout)
    fields = WEIGHT_FIELDS
    if not weights_only:
        saved.update(_restore_item(step_dir / TRAIN, layout))
        fields = WEIGHT_FIELDS + TRAIN_FIELDS
    state = merge_into(target, saved, fields=fields, ignore_keys=ignore_keys, where=label)
    timestamp = None if weights_only else Timestamp.from_state_dict(meta["timestamp"])
    return state, timestamp, meta


def read_weights(checkpoint_dir: str | Path) -> dict[str, Any]:
    """A checkpoint's weights as host arrays by dotted path (``params.<name>``, ``model_state.<name>``), verified
    first; what :func:`torch_bridge.weights_from_checkpoint` maps back onto a torch module's ``state_dict``."""
    path = resolve_load_path(checkpoint_dir)
    verify_checksums(path, path.name)
    host = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    return {name: jax.device_get(x) for name, x in _restore_item(path / WEIGHTS, lambda name, shape: host).items()}


# ---- one directory: Trainer.save_checkpoint / load_path ----------------------------------------------------------
def save_checkpoint(path: str | Path, train_state: TrainState, timestamp: Timestamp, meta: dict | None = None, *,
                    weights_only: bool = False) -> Path:
    """Write a complete checkpoint to ``path`` atomically: it is built beside it and renamed into place."""
    path = Path(path).absolute()  # orbax requires absolute paths (it fails late, in a background thread, otherwise)
    if path.exists():
        raise CheckpointError(f"save_checkpoint: {path} already exists; choose a new path "
                              "(nothing saved is ever overwritten)")
    tmp = path.with_name(f"{path.name}{_TMP}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    items = split_state(train_state, weights_only)
    if flat_arrays.is_small_state(items):
        for item, tree in items.items():
            (tmp / item).mkdir()
            flat_arrays.write(tmp / item / flat_arrays.FILE, flat_arrays.host_copy(flat_paths(tree)))
    else:
        with ocp.StandardCheckpointer() as ckptr:
            for item, tree in items.items():
                ckptr.save(tmp / item, tree)
            ckptr.wait_until_finished()
    (tmp / META_FILE).write_text(json.dumps({"timestamp": timestamp.state_dict(), "weights_only": weights_only,
                                             **(meta or {})}, indent=1))
    write_checksums(tmp)
    tmp.rename(path)
    return path


def resolve_load_path(load_path: str | Path) -> Path:
    """A checkpoint directory, or a ``save_folder`` (its newest good step). Raises naming the path otherwise. In an
    object store (``s3://``, ``gs://``): downloaded and verified first (``remote_checkpoints``)."""
    if is_uri(load_path):
        from jaxcomposer.trainer.remote_checkpoints import resolve_remote_load_path
        return resolve_remote_load_path(str(load_path))
    path = Path(load_path).expanduser().absolute()
    if path.is_symlink():  # Composer's names (ep1-ba4-rank0.pt, latest-rank0.pt) link to the step they name
        path = path.resolve()
    if not path.exists():
        raise CheckpointError(f"load_path: {str(load_path)!r} does not exist (resolved to {path})")
    if is_checkpoint_dir(path):
        return path
    if not path.is_dir():
        raise CheckpointError(f"load_path: {path} is a file; a jaxcomposer checkpoint is a directory (a step of a "
                              "save_folder, a Trainer.save_checkpoint directory, or the save_folder itself)")
    if _TMP in path.name:
        raise CheckpointError(f"load_path: {path} is a save that never completed ({_TMP}); it is never loaded")
    steps = sorted((int(p.name) for p in path.iterdir() if p.name.isdigit() and is_checkpoint_dir(p)), reverse=True)
    for step in steps:
        try:
            verify_checksums(path / str(step), step)
            return path / str(step)
        except CorruptCheckpointError as e:
            warnings.warn(f"load_path: skipping checkpoint step {step}: {e}", stacklevel=2)
    raise CheckpointError(f"load_path: {path} is neither a jaxcomposer checkpoint (expected {WEIGHTS}/ and "
                          f"{META_FILE} inside it) nor a save_folder holding a good one")


# ---- Composer's file names: links to the verified step directories ---------------------------------------------
SAVE_FILENAME = "ep{epoch}-ba{batch}-rank{rank}.pt"
SAVE_LATEST_FILENAME = "latest-rank{rank}.pt"


def format_name(pattern: str, timestamp: Timestamp, run_name: str | None) -> str:
    """Composer's checkpoint name variables: ``{run_name}``, ``{rank}``, ``{local_rank}``, ``{world_size}``,
    ``{node_rank}``, ``{epoch}``, ``{batch}``, ``{batch_in_epoch}``, ``{sample}``, ``{sample_in_epoch}``,
    ``{token}``, ``{token_in_epoch}``."""
    values = {"run_name": run_name or "", "rank": jax.process_index(), "local_rank": 0,
              "world_size": jax.process_count(), "local_world_size": 1, "node_rank": jax.process_index()}
    for unit in ("epoch", "batch", "batch_in_epoch", "sample", "sample_in_epoch", "token", "token_in_epoch"):
        values[unit] = int(getattr(timestamp, unit))
    try:
        return pattern.format(**values)
    except (KeyError, IndexError, ValueError) as e:
        raise CheckpointError(f"save_filename: {pattern!r} uses {e}, which is not one of Composer's variables "
                              f"{sorted(values)}") from None


def check_name_pattern(pattern: str | None, argument: str) -> None:
    """Refuse, before anything is written, a name pattern that cannot be formatted or leaves ``save_folder``."""
    if pattern is None:
        return
    name = format_name(pattern, Timestamp(), "run")
    if Path(name).is_absolute() or ".." in Path(name).parts or not name:
        raise CheckpointError(f"{argument}: {pattern!r} must name a file inside save_folder (relative, no '..')")


def link(folder: Path, name: str, target: str) -> None:
    """``folder/name`` becomes a link to ``folder/target`` (a step directory, or another name), replacing an older
    link of that name atomically."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.relpath(folder / target, path.parent), tmp, target_is_directory=True)
    os.replace(tmp, path)


class CheckpointStore:
    """Periodic checkpoints of a run in ``folder`` (Composer's ``save_folder``), one orbax step per saved batch.

    orbax's ``CheckpointManager`` gives atomic commits (a save killed midway stays a ``*.orbax-checkpoint-tmp``
    directory that is never listed, so it is never loaded), pruning to ``keep`` checkpoints and asynchronous
    writes. The checksums are written by orbax's background thread into the temporary directory just before its
    atomic rename, so a committed step always carries its table and the training loop never waits for hashing.

    ``small_state_bytes``: states up to this size go to ``.npz`` items (``flat_arrays``; 0: always orbax's format).

    ``overwrite=True`` (Composer's ``save_overwrite``): checkpoints already in the folder are deleted at this run's
    first save (not before: a run that fails early destroys nothing), so pruning and autoresume never mix runs.
    """

    def __init__(self, folder: str | Path, *, keep: int = -1, async_save: bool = True, overwrite: bool = False,
                 weights_only: bool = False, small_state_bytes: int = flat_arrays.SMALL_STATE_BYTES,
                 filename: str | None = SAVE_FILENAME, latest_filename: str | None = SAVE_LATEST_FILENAME,
                 run_name: str | None = None):
        self.folder = Path(folder).absolute()  # orbax needs absolute paths
        check_name_pattern(filename, "save_filename")
        check_name_pattern(latest_filename, "save_latest_filename")
        self.filename, self.latest_filename, self.run_name = filename, latest_filename, run_name
        self._unnamed: list[tuple[int, Timestamp]] = []  # saved steps whose Composer names wait for their commit
        self.small_state_bytes = small_state_bytes  # states up to this size are written as .npz items (flat_arrays)
        if keep == 0 or keep < -1:
            raise CheckpointError(f"save_num_checkpoints_to_keep: got {keep}, expected -1 (keep all) or >= 1")
        self.async_save, self.weights_only = async_save, weights_only
        self._in_flight: int | None = None
        async_options = ocp.AsyncOptions(post_finalization_callback=self._seal_in_flight) if async_save else None
        self._options = ocp.CheckpointManagerOptions(max_to_keep=None if keep == -1 else keep, create=False,
                                                     enable_async_checkpointing=async_save,
                                                     async_options=async_options, cleanup_tmp_directories=True)
        self._manager = None
        self._stale = set(self.all_steps()) if overwrite else set()

    @property
    def manager(self) -> ocp.CheckpointManager:
        if self._manager is None:  # created lazily: a run that fails validation writes nothing
            self.folder.mkdir(parents=True, exist_ok=True)
            self._manager = ocp.CheckpointManager(self.folder, item_names=(WEIGHTS, TRAIN, META),
                                                  options=self._options)
        return self._manager

    def _steps_on_disk(self) -> list[int]:
        # read from disk, not the manager's cache: ``latest_step`` must not create the folder or the manager
        if not self.folder.is_dir():
            return []
        return sorted(int(p.name) for p in self.folder.iterdir() if p.name.isdigit() and p.is_dir())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        return self._steps_on_disk() if self._manager is None else sorted(self.manager.all_steps())

    def _seal_in_flight(self) -> None:
        """orbax's background thread, after the step's files are written and before the rename that commits it."""
        step = self._in_flight
        tmp = self.folder / f"{step}{_TMP}"
        if step is not None and tmp.is_dir():
            write_checksums(tmp)

    def newest_good_step(self) -> int | None:
        """The newest step whose files all match their checksums; corrupt ones are reported and passed over."""
        for step in sorted(self.all_steps(), reverse=True):
            try:
                verify_checksums(self.folder / str(step), step)
                return step
            except CorruptCheckpointError as e:
                warnings.warn(f"autoresume: skipping checkpoint step {step}: {e}", stacklevel=2)
        return None

    def save(self, step: int, train_state: TrainState, timestamp: Timestamp, meta: dict | None = None) -> None:
        manager = self.manager
        manager.wait_until_finished()  # one save in flight: the sealing callback knows which step it seals
        self._name_committed()
        for old in sorted(self._stale):
            manager.delete(old)
        self._stale = set()
        self._unnamed.append((step, timestamp))
        items = split_state(train_state, self.weights_only)
        if flat_arrays.is_small_state(items, self.small_state_bytes):
            args = {name: flat_arrays.FlatArraysSave(flat_arrays.host_copy(flat_paths(tree)))
                    for name, tree in items.items()}
        else:
            args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
        args[META] = ocp.args.JsonSave({"timestamp": timestamp.state_dict(), "weights_only": self.weights_only,
                                        **(meta or {})})
        self._in_flight = step
        manager.save(step, args=ocp.args.Composite(**args))
        if not self.async_save:
            manager.wait_until_finished()
            if (self.folder / str(step)).is_dir():
                write_checksums(self.folder / str(step))
            self._name_committed()

    def _name_committed(self) -> None:
        """Composer's names for the steps committed since the last call (``ep1-ba4-rank0.pt`` links to the step
        directory, and ``latest-rank0.pt`` moves to the newest name), made only once a step is complete and
        checksummed, so a name never points at a torn save; names of steps pruned by ``keep`` go with them."""
        if not self.folder.is_dir() or (self.filename is None and self.latest_filename is None):
            self._unnamed = []
            return
        for step, timestamp in self._unnamed:
            if (self.folder / str(step)).is_dir():
                target = str(step)
                if self.filename is not None:
                    target = format_name(self.filename, timestamp, self.run_name)
                    link(self.folder, target, str(step))
                if self.latest_filename is not None:  # to the newest checkpoint's name, as Composer's symlink
                    link(self.folder, format_name(self.latest_filename, timestamp, self.run_name), target)
        self._unnamed = []
        for parent, dirs, files in os.walk(self.folder):  # (not into steps: names live beside them)
            dirs[:] = [d for d in dirs if not (d.isdigit() and parent == str(self.folder)) and _TMP not in d]
            for name in dirs + files:
                path = Path(parent) / name
                if path.is_symlink() and not path.exists():  # its step was pruned (save_num_checkpoints_to_keep)
                    path.unlink()

    def restore(self, step: int, target_state: TrainState, **kw) -> tuple[TrainState, Timestamp | None, dict]:
        return restore(self.folder / str(step), target_state, label=f"checkpoint step {step} in {self.folder}", **kw)

    def location(self, step: int) -> str:
        """Where step ``step`` is, for messages."""
        return str(self.folder / str(step))

    def wait(self) -> None:
        if self._manager is not None:
            self._manager.wait_until_finished()
            self._name_committed()

    def close(self) -> None:
        if self._manager is not None:
            self.wait()
            self._manager.close()
            self._manager = None


def open_store(folder: str | Path, **kwargs: Any):
    """The store of checkpoints in ``folder``: a local :class:`CheckpointStore`, or for an object-store URI
    (``s3://``, ``gs://``) a ``RemoteCheckpointStore`` (staged here, uploaded in the background, the same
    guarantees); ``kwargs`` are theirs (``keep``, ``overwrite``, ``weights_only``, the name patterns, ``run_name``)."""
    if is_uri(str(folder)):
        from jaxcomposer.trainer.remote_checkpoints import RemoteCheckpointStore
        return RemoteCheckpointStore(str(folder), **kwargs)
    return CheckpointStore(folder, **kwargs)


def store_for_run(a: Any, run_name: str) -> tuple[CheckpointStore | None, int | None]:
    """The run's CheckpointStore (or None) and the step autoresume continues from (or None), from the Trainer's
    validated arguments ``a``; ``run_name`` is the run's name, given (``a.run_name``) or made."""
    if a.autoresume:
        needs = [(a.save_folder is None, "save_folder (where to look for the latest checkpoint)"),
                 (a.run_name is None, "run_name (so a relaunch is recognised as the same run)")]
        missing = [what for absent, what in needs if absent]
        if missing:
            raise ConfigurationError(f"autoresume: needs {' and '.join(missing)}, as in Composer")
        if a.save_overwrite:
            raise ConfigurationError("save_overwrite: cannot be True with autoresume=True (one continues the "
                                     "saved run, the other replaces it); choose one")
        if a.save_weights_only:
            raise ConfigurationError("save_weights_only: autoresume needs full checkpoints (optimizer state, "
                                     "RNG, position) to continue; drop one of the two")
    if a.save_folder is None:
        return None, None
    try:
        # Composer's save_folder may name the run: '{run_name}/checkpoints'
        store = open_store(str(a.save_folder).replace("{run_name}", run_name), keep=a.save_num_checkpoints_to_keep,
                           overwrite=a.save_overwrite, weights_only=a.save_weights_only, filename=a.save_filename,
                           latest_filename=a.save_latest_filename, run_name=run_name)
        latest = store.latest_step()  # (an object store is asked now: a missing bucket fails here, not later)
    except CheckpointError as e:
        raise ConfigurationError(str(e)) from e
    if latest is not None and not (a.autoresume or a.save_overwrite):
        raise ConfigurationError(f"save_folder: {store.folder} already holds checkpoints (latest batch "
                                 f"{latest}); pass autoresume=True to continue that run, save_overwrite=True to "
                                 "replace it, or choose a new folder")
    # autoresume takes the newest checkpoint that passes its checksums, saying which ones it passed over
    return store, (store.newest_good_step() if a.autoresume and latest is not None else None)
