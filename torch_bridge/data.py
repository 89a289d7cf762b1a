"""Feed torch data to jaxcomposer's jitted ``Trainer``: numpy dict batches, never torch tensors.

Two entry points:

* ``from_dataset(ds, batch_size, ...)`` -- the preferred path. A map-style torch ``Dataset`` (``__len__`` +
  ``__getitem__``) is read through the same index pipeline as ``jaxcomposer.data.ArrayLoader``: the order
  of an epoch is a pure function of ``(seed, epoch)`` (same shuffle as ``ArrayLoader`` for the same seed), any
  batch is addressable directly, so ``get_state``/``set_state`` resume is exact and costs nothing.
* ``from_dataloader(dl)`` -- wraps an existing ``torch.utils.data.DataLoader`` (custom samplers, worker processes,
  ``IterableDataset``). Batches are converted to numpy in the main process, so the DataLoader's own
  ``collate_fn`` is left untouched (nothing unpicklable is installed; spawn workers keep working). Resume is best
  effort: torch sampler/worker RNG state cannot be captured, so ``set_state`` re-seeds via ``set_epoch`` (exact for
  ``DistributedSampler`` and ``SequentialSampler``; not for an unseeded ``RandomSampler``) and skips batches by
  loading them. Use ``from_dataset`` when resume must be exact.

Conversion (both paths): torch tensors -> ``.numpy()`` (detached, on CPU; bfloat16 via ``ml_dtypes``), python
numbers -> numpy; int64 -> int32 and float64 -> float32 (JAX's default x32 types). ``(x, y)`` examples/batches
become ``{'input': x, 'target': y}`` (names from ``keys``), dicts stay dicts (converted recursively), and a single
array becomes ``{keys[0]: array}``.
"""

from __future__ import annotations

import multiprocessing
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from jaxcomposer.data.loader import IndexedLoader

from . import kernels

__all__ = ["DatasetLoader", "DataLoaderWrapper", "from_dataset", "from_dataloader", "to_numpy", "numpy_collate"]

Batch = dict[str, Any]
Transform = Callable[[Batch, np.random.Generator], Batch]
_NARROW = {np.dtype(np.int64): np.int32, np.dtype(np.float64): np.float32}


# ---- conversion ------------------------------------------------------------------------------------------------
def _array(value: Any) -> np.ndarray:
    """One leaf to numpy with JAX's x32 dtypes. Raises ``TypeError`` for non-numeric leaves (str, None, ...)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            import ml_dtypes  # ships with jax

            arr = t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            arr = t.numpy()
    else:
        arr = np.asarray(value)
    if arr.dtype.kind not in "biufc" and arr.dtype.name != "bfloat16":
        raise TypeError(f"cannot turn a {type(value).__name__} (dtype {arr.dtype}) into a numeric array for JAX")
    narrow = _NARROW.get(arr.dtype)
    return arr.astype(narrow) if narrow is not None else arr


def _named(value: Any, keys: Sequence[str], what: str) -> Mapping[str, Any]:
    """Top-level structure: dict stays, tuple/list is zipped with ``keys``, anything else is ``{keys[0]: value}``."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, (tuple, list)):
        if len(value) != len(keys):
            raise ValueError(f"{what} is a {type(value).__name__} of {len(value)} items but keys={tuple(keys)} names "
                             f"{len(keys)}; pass keys=(...) with one name per item, or return a dict")
        return dict(zip(keys, value))
    return {keys[0]: value}


def _tree(value: Any, leaf: Callable[[Any], np.ndarray]) -> Any:
    if isinstance(value, Mapping):
        return {k: _tree(v, leaf) for k, v in value.items()}
    return leaf(value)


def to_numpy(batch: Any, keys: Sequence[str] = ("input", "target")) -> Batch:
    """Convert an already-collated batch (tensor, ``(x, y)`` or dict, possibly nested dicts) to a numpy dict."""
    return {k: _tree(v, _array) for k, v in _named(batch, keys, "batch").items()}


def _stack(values: list) -> Any:
    first = values[0]
    if isinstance(first, Mapping):
        return {k: _stack([v[k] for v in values]) for k in first}
    return np.stack([_array(v) for v in values])


def numpy_collate(examples: Sequence[Any], keys: Sequence[str] = ("input", "target")) -> Batch:
    """Default collate of ``from_dataset``: stack examples along a new batch axis into a numpy dict."""
    named = [_named(e, keys, "example") for e in examples]
    return {k: _stack([e[k] for e in named]) for k in named[0]}


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


# ---- from_dataset ----------------------------------------------------------------------------------------------
class DatasetLoader(IndexedLoader):
    """``ArrayLoader``'s protocol over a map-style torch ``Dataset``; see ``from_dataset``.

    Epoch, position and resume semantics are jaxcomposer's :class:`IndexedLoader`'s (the same order as an
    ``ArrayLoader`` with the same seed).
    """

    def __init__(self, dataset: Any, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
                 collate: Callable[[list], Any] | None = None, keys: Sequence[str] = ("input", "target"),
                 transform: Transform | None = None, worker_count: int = 0, read_threads: int = 4):
        if isinstance(dataset, DataLoader):
            raise TypeError("from_dataset got a DataLoader; use torch_bridge.data.from_dataloader(dl) for it, or pass "
                            "its .dataset here")
        map_style = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
        if isinstance(dataset, IterableDataset) or not map_style:
            raise TypeError(f"from_dataset needs a map-style dataset (__len__ and __getitem__); got "
                            f"{type(dataset).__name__}. For an IterableDataset or a custom sampler wrap a "
                            "DataLoader with torch_bridge.data.from_dataloader(dl)")
        batch_size = _check_int("batch_size", batch_size, 1)
        self.seed = _check_int("seed", seed, 0)
        self.read_threads = _check_int("read_threads", read_threads, 1)
        if _check_int("worker_count", worker_count, 0):
            raise ValueError("from_dataset reads in-process (use read_threads=N for a thread pool); for worker "
                             "processes wrap DataLoader(ds, num_workers=N, multiprocessing_context='spawn', "
                             "persistent_workers=True) with from_dataloader (resume is then best effort)")
        if isinstance(keys, str) or not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"keys must be a non-empty sequence of str, got {keys!r}")
        n = len(dataset)
        if n == 0:
            raise ValueError(f"dataset {type(dataset).__name__} is empty (len 0)")
        super().__init__(n, batch_size, shuffle=shuffle, seed=self.seed, drop_last=drop_last, transform=transform)
        self.dataset, self.keys, self.collate, self.worker_count = dataset, tuple(keys), collate, 0
        # TensorDataset + default collate: one fancy-index gather per tensor instead of a Python loop.
        self._tensors = dataset.tensors if isinstance(dataset, TensorDataset) and collate is None else None
        self._pool: ThreadPoolExecutor | None = None

    def _fetch(self, indices: np.ndarray) -> list:
        idx = [int(i) for i in indices]
        if self.read_threads > 1 and len(idx) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.read_threads, thread_name_prefix="torch_bridge-read")
            return list(self._pool.map(self.dataset.__getitem__, idx))  # map keeps the order
        return [self.dataset[i] for i in idx]

    def _gather(self, indices: np.ndarray) -> Batch:
        if self._tensors is not None:
            rows = torch.as_tensor(np.asarray(indices, dtype=np.int64))
            return to_numpy(tuple(t[rows] for t in self._tensors), self.keys)
        examples = self._fetch(indices)
        batch = numpy_collate(examples, self.keys) if self.collate is None else self.collate(examples)
        return to_numpy(batch, self.keys)  # a custom collate may still return tensors or a tuple

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def __repr__(self) -> str:
        return (f"DatasetLoader({type(self.dataset).__name__}, num_samples={self._n}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed}, epoch={self._epoch}, "
                f"batch_index={self._batch_index})")


def from_dataset(ds: Any, batch_size: int, *, seed: int = 0, shuffle: bool = True, drop_last: bool = True,
                 collate: Callable[[list], Any] | None = None, keys: Sequence[str] = ("input", "target"),
                 transform: Transform | None = None, worker_count: int = 0, read_threads: int = 4) -> DatasetLoader:
    """Loader over a map-style torch ``Dataset`` with ``ArrayLoader``'s protocol (exact, JSON-able resume).

    ``collate(examples)`` replaces ``numpy_collate``; whatever it returns is still passed through ``to_numpy``.
    ``transform(batch, rng)`` runs per batch with an rng seeded from ``(seed, epoch, batch_index)``.
    ``read_threads > 1`` calls ``ds[i]`` from a thread pool (order preserved; helps I/O- or GIL-releasing reads).
    ``worker_count`` must be 0 (kept for ``ArrayLoader`` parity): for processes use ``from_dataloader``.
    """
    return DatasetLoader(ds, batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last, collate=collate, keys=keys,
                         transform=transform, worker_count=worker_count, read_threads=read_threads)


# ---- from_dataloader -------------------------------------------------------------------------------------------
def _start_method(dl: DataLoader) -> str | None:
    ctx = dl.multiprocessing_context
    if ctx is None:  # the global default, without fixing it as a side effect
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    return ctx if isinstance(ctx, str) else ctx.get_start_method()


class DataLoaderWrapper:
    """Numpy-dict view of a torch ``DataLoader`` with the loader protocol; see ``from_dataloader``."""

    def __init__(self, dl: DataLoader, *, keys: Sequence[str] = ("input", "target")):
        if not isinstance(dl, DataLoader):
            raise TypeError(f"from_dataloader needs a torch.utils.data.DataLoader, got {type(dl).__name__}; for a "
                            "map-style Dataset use torch_bridge.data.from_dataset(ds, batch_size)")
        if isinstance(keys, str) or not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"keys must be a non-empty sequence of str, got {keys!r}")
        self.dataloader, self.keys = dl, tuple(keys)
        self.yields_pairs: bool | None = None  # whether the DataLoader's batches are sequences (known once read)
        self.batch_size = dl.batch_size if dl.batch_size is not None else getattr(dl.batch_sampler, "batch_size", None)
        self._epoch = self._batch_index = 0
        if dl.num_workers > 0 and _start_method(dl) == "fork" and "jax" in sys.modules:
            warnings.warn(
                f"this DataLoader starts {dl.num_workers} worker processes with the 'fork' start method after JAX was "
                "imported; JAX is multithreaded, so forked workers can deadlock. Build it with "
                "multiprocessing_context='spawn' (or 'forkserver') and persistent_workers=True (so the spawn cost "
                "is paid once); the dataset and collate_fn must then be picklable, module-level objects",
                RuntimeWarning, stacklevel=3)

    @property
    def num_samples(self) -> int | None:
        try:
            return len(self.dataloader.dataset)
        except TypeError:
            return None

    def __len__(self) -> int:
        return len(self.dataloader)  # TypeError for an IterableDataset without __len__, as torch does

    def _len_or_none(self) -> int | None:
        try:
            return len(self.dataloader)
        except TypeError:
            return None

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next ``__iter__`` (forwarded to the sampler's ``set_epoch`` when it has one)."""
        if _check_int("epoch", epoch, 0) != self._epoch:
            self._epoch, self._batch_index = int(epoch), 0
        self._forward_epoch()

    def _forward_epoch(self) -> None:
        seen = set()
        for obj in (self.dataloader.sampler, self.dataloader.batch_sampler,
                    getattr(self.dataloader.batch_sampler, "sampler", None)):
            if obj is not None and id(obj) not in seen and callable(getattr(obj, "set_epoch", None)):
                seen.add(id(obj))
                obj.set_epoch(self._epoch)

    def get_state(self) -> dict[str, int]:
        return {"epoch": self._epoch, "batch_index": self._batch_index}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Best effort: re-seed via ``set_epoch`` and skip ``batch_index`` batches (by loading them) next time.

        Exact only if the DataLoader's order is a function of the epoch (``DistributedSampler``, no shuffle, or a
        sampler with its own ``set_epoch``) -- torch sampler/worker RNG state cannot be captured. Use
        ``from_dataset`` for exact resume.
        """
        missing = {"epoch", "batch_index"} - set(state)
        if missing:
            raise ValueError(f"loader state is missing {sorted(missing)}; got keys {sorted(state)}")
        epoch, index, n = int(state["epoch"]), int(state["batch_index"]), self._len_or_none()
        if epoch < 0 or index < 0 or (n is not None and index > n):
            raise ValueError(f"invalid loader position epoch={epoch}, batch_index={index} (epoch has {n})")
        self._epoch, self._batch_index = (epoch + 1, 0) if index == n else (epoch, index)
        self._forward_epoch()

    def __iter__(self) -> Iterator[Batch]:
        epoch, skip, n = self._epoch, self._batch_index, self._len_or_none()
        self._forward_epoch()
        for i, raw in enumerate(self.dataloader):
            if i < skip:
                continue
            batch = to_numpy(raw, self.keys)
            self.yields_pairs = isinstance(raw, (tuple, list))  # what a Composer algorithm sees as state.batch
            kernels.release_openmp_team()  # the collate's OpenMP team would slow the oneDNN convolutions' own
            self._epoch, self._batch_index = (epoch + 1, 0) if n is not None and i + 1 == n else (epoch, i + 1)
            yield batch
        self._epoch, self._batch_index = epoch + 1, 0  # only reached when exhausted (a `break` closes us at yield)

    def __repr__(self) -> str:
        return (f"DataLoaderWrapper(batch_size={self.batch_size}, num_workers={self.dataloader.num_workers}, "
                f"epoch={self._epoch}, batch_index={self._batch_index})")


def from_dataloader(dl: DataLoader, *, keys: Sequence[str] = ("input", "target")) -> DataLoaderWrapper:
    """Wrap a torch ``DataLoader``: numpy dict batches, ``len``, ``batch_size``, ``set_epoch`` forwarding.

    Warns (``RuntimeWarning``) if it uses fork-started workers after JAX is imported. ``get_state``/``set_state``
    resume is best effort (see ``DataLoaderWrapper.set_state``).
    """
    return DataLoaderWrapper(dl, keys=keys)
