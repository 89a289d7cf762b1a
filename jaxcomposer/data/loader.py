"""In-memory batch loading with an exact, JSON-able resume position.

Why this shape: the datasets jaxcomposer trains on offline (Fashion-MNIST, digits, a byte corpus) fit in host
memory, so the fastest correct loader is "shuffle indices, gather a whole batch with one numpy fancy-index".
An epoch's order is one numpy permutation drawn from a generator seeded by ``(seed, epoch)``: a pure function of
both, cheap to compute, and any batch of it can be addressed directly. That makes resuming cheap
(skip to batch ``k`` without touching earlier batches) and bitwise exact, which exact resume requires
(docs/design.md, "Train state and checkpoints"). (grain's ``MapDataset.shuffle`` gives the same guarantees but
computes each index in Python, host CPU that a small machine takes from the training step.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from jaxcomposer.errors import DataError

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.random.Generator], Batch]

# Distinct domain tags so the shuffle seed and the transform RNG never share a stream.
_SHUFFLE_TAG = 0
_TRANSFORM_TAG = 1


def derive_seed(*entropy: int) -> int:
    """Mix non-negative ints into one 31-bit seed (``SeedSequence`` hashing: nearby inputs give unrelated seeds)."""
    return int(np.random.SeedSequence([int(e) for e in entropy]).generate_state(1, np.uint32)[0] >> 1)


def _first_dim(array: Any) -> int:
    shape = getattr(array, "shape", None)
    if not shape:
        raise DataError(f"every array needs a leading example dimension; got shape {shape!r}")
    return int(shape[0])


class IndexedLoader:
    """The position logic shared by our loaders: batches of example indices, a pure function of (seed, epoch).

    Epoch semantics (like torch's ``DistributedSampler``): ``set_epoch(e)`` selects the permutation used by the
    next ``__iter__``; it is a pure function of ``(seed, e)``. Finishing an epoch advances the position to
    ``(e + 1, 0)``, so a plain ``for`` loop repeated over the loader also sees fresh orders. Breaking out of a
    loop leaves the position where it stopped: the next ``__iter__`` continues from there (that is what makes
    ``get_state``/``set_state`` resume exact). ``set_epoch`` to a *different* epoch restarts at batch 0; to the
    current epoch it is a no-op, so a trainer that calls ``set_epoch`` after ``set_state`` keeps the resumed spot.

    ``transform(batch, rng)`` runs on the host per batch; ``rng`` is seeded from ``(seed, epoch, batch index)`` so
    it is deterministic and resumable. Subclasses implement ``_gather(indices) -> batch``. One iteration at a
    time: two live iterators over the same loader share (and fight over) the position.
    """

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int, drop_last: bool,
                 transform: Transform | None):
        if drop_last and batch_size > num_samples:
            raise DataError(
                f"batch_size={batch_size} is larger than the dataset size {num_samples} and drop_last=True, so an "
                f"epoch would have no batches; use a batch_size <= {num_samples} or drop_last=False"
            )
        self._n = int(num_samples)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.transform = transform
        self._epoch = 0
        self._batch_index = 0
        self._process = (0, 1)  # (this process, processes): which rows of each batch this loader yields

    def shard_for_processes(self, index: int, count: int) -> "IndexedLoader":
        """Yield only process ``index``'s rows of every batch (the ``index``-th of ``count`` equal blocks), for a
        run spread over ``count`` processes: each feeds its own devices, and together they feed exactly the
        batches one process would (``batch_size`` stays the global batch, ``len()`` and positions the same, so
        resume works as before). A batch-level ``transform`` sees the whole batch, then its rows are taken, so its
        randomness does not depend on the process count."""
        if not (isinstance(count, int) and count >= 1 and isinstance(index, int) and 0 <= index < count):
            raise DataError(f"shard_for_processes: got index={index!r}, count={count!r}; expected 0 <= index < count")
        if self.batch_size % count:
            raise DataError(f"batch_size={self.batch_size} does not split evenly over {count} processes; use a "
                            f"multiple of {count}")
        self._process = (index, count)
        return self

    def _rows(self, n: int) -> tuple[int, int]:
        index, count = self._process
        return index * n // count, (index + 1) * n // count

    def _gather_rows(self, indices: np.ndarray, lo: int, hi: int) -> Batch:
        """Rows ``lo:hi`` of the batch of ``indices``; loaders whose examples depend on their slot override it."""
        return self._gather(indices[lo:hi])

    # -- size -------------------------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Number of examples in the underlying data (not the number yielded per epoch when drop_last)."""
        return self._n

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._n // self.batch_size if self.drop_last else -(-self._n // self.batch_size)

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- epoch and position -----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Choose the permutation of the next ``__iter__``; restarts at batch 0 unless ``epoch`` is current."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise DataError(f"epoch must be an int >= 0, got {epoch!r}")
        if epoch != self._epoch:
            self._epoch, self._batch_index = int(epoch), 0

    def get_state(self) -> dict[str, int]:
        """JSON-able position: the next batch the loader will yield, plus the config it is only valid for."""
        return {
            "epoch": self._epoch,
            "batch_index": self._batch_index,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "num_samples": self._n,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a ``get_state()`` dict; the next ``__iter__`` yields exactly the batches not yet yielded.

        Only ``epoch`` and ``batch_index`` are required (a trainer may build them from its own step count, which
        is the right thing to do when a prefetcher ran ahead of the consumer). ``seed``/``batch_size``/
        ``num_samples``, when present, must match this loader, because the position means nothing otherwise.
        """
        missing = {"epoch", "batch_index"} - set(state)
        if missing:
            raise DataError(f"loader state is missing {sorted(missing)}; got keys {sorted(state)}")
        for key, mine in (("seed", self.seed), ("batch_size", self.batch_size), ("num_samples", self._n)):
            if key in state and int(state[key]) != mine:
                raise DataError(f"loader state was saved with {key}={state[key]} but this loader has {key}={mine}")
        epoch, index = int(state["epoch"]), int(state["batch_index"])
        if epoch < 0 or not 0 <= index <= len(self):
            raise DataError(f"invalid loader position epoch={epoch}, batch_index={index} (epoch has {len(self)})")
        self._epoch, self._batch_index = (epoch + 1, 0) if index == len(self) else (epoch, index)

    # -- iteration --------------------------------------------------------------------------------------------
    def _index_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches of example indices for ``epoch`` (a pure function of seed and epoch), as views of one
        permutation."""
        order = (np.random.default_rng(derive_seed(self.seed, epoch, _SHUFFLE_TAG)).permutation(self._n)
                 if self.shuffle else np.arange(self._n))
        b = self.batch_size
        return [order[i * b:(i + 1) * b] for i in range(len(self))]

    def epoch_indices(self, epoch: int) -> list[np.ndarray]:
        """The example indices of every batch of ``epoch`` (for tests and debugging; does not move the position)."""
        return [batch.copy() for batch in self._index_batches(epoch)]

    def _gather(self, indices: np.ndarray) -> Batch:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Batch]:
        epoch, start = self._epoch, self._batch_index
        ds = self._index_batches(epoch)
        num_batches = len(ds)
        for i in range(start, num_batches):
            lo, hi = self._rows(len(ds[i]))
            if self.transform is None:
                batch = self._gather_rows(ds[i], lo, hi)
            else:
                rng = np.random.default_rng(derive_seed(self.seed, epoch, i, _TRANSFORM_TAG))
                batch = self.transform(self._gather_rows(ds[i], 0, len(ds[i])), rng)
                if (lo, hi) != (0, len(ds[i])):
                    batch = {k: v[lo:hi] for k, v in batch.items()}
            # Advance before yielding: once the consumer holds batch i, the position is "next is i + 1".
            self._epoch, self._batch_index = (epoch + 1, 0) if i + 1 == num_batches else (epoch, i + 1)
            yield batch


class ArrayLoader(IndexedLoader):
    """Iterable of ``dict[str, np.ndarray]`` batches over in-memory arrays sharing their first dimension.

    Position, epoch and resume semantics are :class:`IndexedLoader`'s. Arrays may be numpy arrays or any array-like
    with ``.shape`` and numpy fancy indexing (e.g. ``TokenWindows``). A ``transform`` must not mutate the input
    arrays in place (they may be views).

    ``worker_count`` is validated (``>= 0``) but otherwise unused: a batch is one vectorized gather, which is
    faster in-process than through worker processes; ``prefetch_to_device`` overlaps it with the training step.
    """

    def __init__(
        self,
        arrays: Mapping[str, Any],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        transform: Transform | None = None,
        worker_count: int = 0,
    ):
        if not isinstance(arrays, Mapping) or not arrays:
            raise DataError("ArrayLoader needs a non-empty mapping of name -> array")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
            raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
        if worker_count < 0:
            raise DataError(f"worker_count must be >= 0, got {worker_count}")
        if seed < 0:
            raise DataError(f"seed must be >= 0, got {seed}")
        self._arrays = {k: (v if hasattr(v, "shape") else np.asarray(v)) for k, v in arrays.items()}
        sizes = {k: _first_dim(v) for k, v in self._arrays.items()}
        if len(set(sizes.values())) > 1:
            listing = ", ".join(f"{k!r}: {n}" for k, n in sizes.items())
            raise DataError(f"all arrays must have the same first dimension; got {listing}")
        n = next(iter(sizes.values()))
        if n == 0:
            raise DataError(f"dataset is empty (arrays {sorted(sizes)} have 0 examples)")
        super().__init__(n, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, transform=transform)
        self.worker_count = int(worker_count)

    def _gather(self, indices: np.ndarray) -> Batch:
        idx = np.asarray(indices, dtype=np.int64)
        return {k: np.asarray(v[idx]) for k, v in self._arrays.items()}

    def __repr__(self) -> str:
        return (
            f"ArrayLoader(keys={sorted(self._arrays)}, num_samples={self._n}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, drop_last={self.drop_last}, seed={self.seed}, epoch={self._epoch}, "
            f"batch_index={self._batch_index})"
        )
