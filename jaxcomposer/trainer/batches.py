"""Batches as the Trainer takes them from loaders: normalized to dicts of arrays, counted, padded."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxcomposer.core import adapters
from jaxcomposer.errors import ConfigurationError


def as_batch(batch: Any) -> dict:
    """Normalize a loader's batch: dicts pass through, ``(input, target)`` pairs get Composer's default keys;
    torch tensors and other array-likes become numpy (torch tensors never reach jit)."""
    if isinstance(batch, (tuple, list)):
        if len(batch) != 2:
            raise ConfigurationError(f"train/eval batch: a tuple batch must be (input, target), got {len(batch)} items")
        batch = {"input": batch[0], "target": batch[1]}
    if not isinstance(batch, dict):
        raise ConfigurationError(f"batch: expected a dict of arrays or an (input, target) pair, got "
                                 f"{type(batch).__name__}")
    return {k: v if isinstance(v, (np.ndarray, jax.Array)) else np.asarray(getattr(v, "numpy", lambda: v)())
            for k, v in batch.items()}


def rows_in(batch: dict) -> int:
    """The leading dimension of a batch's first array."""
    return int(jax.tree_util.tree_leaves(batch)[0].shape[0])


def as_loader(loader, name: str):
    """Another framework's loader (a torch DataLoader) through its adapter; our own loaders pass through."""
    adapter = adapters.adapter_for(loader)
    converted = None if adapter is None or adapter.to_loader is None else adapter.to_loader(loader, name)
    return loader if converted is None else converted


def round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def pad_batch(batch: dict, size: int) -> tuple[dict, np.ndarray]:
    """``(batch padded with zeros to size rows, a mask of the real rows)``: eval batches all have the first one's
    size, so the eval step compiles once."""
    n = rows_in(batch)
    if n > size:
        raise ConfigurationError(f"eval batch of {n} examples is larger than the first eval batch ({size}); "
                                 "eval loaders must yield batches no larger than their first one")
    mask = np.zeros((size,), np.float32)
    mask[:n] = 1.0
    if n == size:
        return batch, mask
    padding = {k: np.zeros((size - n,) + v.shape[1:], v.dtype) for k, v in batch.items()}
    return {k: np.concatenate([np.asarray(v), padding[k]]) for k, v in batch.items()}, mask
