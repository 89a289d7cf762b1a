"""The learning-rate multiplier read on the host, from tables the device computes a chunk of steps at a time."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

TABLE_STEPS = 4096  # steps per table


class HostLRTable:
    """``table(step)`` = ``multiplier(step)`` (a jitted function of the step: the schedule the train step compiles
    in), read from a table of ``TABLE_STEPS`` steps computed at its first read. Asking the device every batch
    (LRMonitor does) would wait for the train step in flight, since a device runs its work in order: the host
    would lose its one-step lead and the next step could not be queued meanwhile."""

    def __init__(self, multiplier: Callable[[jax.Array], jax.Array]):
        self.multiplier = multiplier
        self.chunks: dict[int, np.ndarray] = {}  # chunk index -> its table

    def __call__(self, step: int) -> float:
        chunk, i = divmod(int(step), TABLE_STEPS)
        table = self.chunks.get(chunk)
        if table is None:
            steps = jnp.arange(chunk * TABLE_STEPS, (chunk + 1) * TABLE_STEPS)
            table = self.chunks[chunk] = np.asarray(jax.vmap(self.multiplier)(steps))
        return float(table[i])
