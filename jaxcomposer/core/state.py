"""``TrainState``: everything a step reads and writes, as one pytree (so it jits, shards and checkpoints whole)."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class TrainState(NamedTuple):
    """``step`` is the number of optimizer steps taken; ``extras`` holds method state by method name (EMA, ...);
    ``key`` is the run's base key: step keys are ``fold_in(key, step)``, so the key itself never changes."""

    step: jax.Array
    params: Any
    model_state: Any
    opt_state: Any
    extras: dict
    key: jax.Array


def tree_select(pred: jax.Array, on_true: Any, on_false: Any) -> Any:
    """``jnp.where(pred, a, b)`` over two trees of one structure, for a scalar boolean ``pred``.

    One ``select`` per leaf, where ``jnp.where`` stages a nested jitted function per leaf: on a train state's ~100
    leaves that halves what the selection costs to trace and lower (the program is the same)."""
    def select(a, b):
        if jnp.shape(a) != jnp.shape(b) or jnp.result_type(a) != jnp.result_type(b):
            return jnp.where(pred, a, b)  # mixed shapes or dtypes: jnp.where broadcasts and promotes
        return jax.lax.select(pred, a, b)

    return jax.tree.map(select, on_true, on_false)
