"""Small train states as one ``.npz`` per checkpoint item, written inside orbax's ``CheckpointManager``.

orbax writes every leaf through tensorstore, a fixed CPU cost per leaf whatever its size, which dominates saving a
small state of many leaves and slowed frequent saves of the quickstart; one uncompressed ``.npz`` is far cheaper
(``benchmarks/checkpoint_timing.py``). Only
the item's file format changes: the manager still gives the temporary directory and atomic rename, the async
commit, pruning, and the checksums written before the rename.

A state uses this format when every leaf is an ordinary array held by this process (one host) and all of them
together take at most ``SMALL_STATE_BYTES``; anything larger, sharded across hosts, or holding typed PRNG keys
stays on orbax's array format, which writes in parallel and per shard. Restores read either format.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from orbax.checkpoint import checkpoint_args
from orbax.checkpoint._src.futures import future
from orbax.checkpoint._src.handlers import async_checkpoint_handler

FILE = "arrays.npz"
SMALL_STATE_BYTES = 16 << 20
_DTYPES = "__dtypes__"  # the dtype name of every array: bfloat16 and other ml_dtypes are stored as raw unsigned ints


def is_small_state(tree, limit_bytes: int = SMALL_STATE_BYTES) -> bool:
    """Whether ``tree`` is written as ``.npz`` items (see the module docstring)."""
    if limit_bytes <= 0 or jax.process_count() != 1:
        return False
    leaves = jax.tree_util.tree_leaves(tree)
    for x in leaves:
        if not isinstance(x, (jax.Array, np.ndarray)):  # Python scalars and other leaves: orbax's handlers know them
            return False
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):  # typed keys have no host representation
            return False
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return False
    return sum(x.size * x.dtype.itemsize for x in leaves) <= limit_bytes


def host_copy(arrays: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Copies on the host, taken before the save returns: the next step donates the device buffers."""
    return {name: np.array(x, copy=True) for name, x in arrays.items()}


def write(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    stored, dtypes = {}, {}
    for name, x in arrays.items():
        dtypes[name] = str(x.dtype)
        # numpy writes its own dtypes only; ml_dtypes (bfloat16, float8_*) travel as unsigned ints of their width
        native = type(x.dtype).__module__.startswith("numpy") and x.dtype.kind != "V"
        stored[name] = x if native else x.view(f"u{x.dtype.itemsize}")
    stored[_DTYPES] = np.array(json.dumps(dtypes))
    with open(path, "wb") as f:
        np.savez(f, **stored)
        f.flush()
        os.fsync(f.fileno())  # the rename that commits the step must not outrun the data


def read(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as f:
        dtypes = json.loads(str(f[_DTYPES]))
        out = {}
        for name, dtype in dtypes.items():
            x, want = f[name], jnp.dtype(dtype)
            out[name] = x if x.dtype == want else x.view(want)
    return out


def is_flat_item(item_dir: Path) -> bool:
    return (item_dir / FILE).is_file()


class FlatArraysHandler(async_checkpoint_handler.AsyncCheckpointHandler):
    """orbax handler of one item written as ``arrays.npz`` (``{dotted path: host array}``)."""

    async def async_save(self, directory, args: FlatArraysSave):
        async def commit():
            write(Path(directory) / FILE, args.arrays)

        return [future.CommitFutureAwaitingContractedSignals(commit(), name="flat_arrays_save")]

    def save(self, directory, args: FlatArraysSave):
        write(Path(directory) / FILE, args.arrays)

    def restore(self, directory, args: FlatArraysRestore | None = None) -> dict[str, np.ndarray]:
        return read(Path(directory) / FILE)


@checkpoint_args.register_with_handler(FlatArraysHandler, for_save=True)
@dataclasses.dataclass
class FlatArraysSave(checkpoint_args.CheckpointArgs):
    arrays: Mapping[str, np.ndarray]


@checkpoint_args.register_with_handler(FlatArraysHandler, for_restore=True)
@dataclasses.dataclass
class FlatArraysRestore(checkpoint_args.CheckpointArgs):
    pass
