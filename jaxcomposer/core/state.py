"""``TrainState``: everything a step reads and writes, as one pytree (so it jits, shards and checkpoints whole)."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax


class TrainState(NamedTuple):
    """``step`` is the number of optimizer steps taken; ``extras`` holds method state by method name (EMA, ...);
    ``key`` is the run's base key: step keys are ``fold_in(key, step)``, so the key itself never changes."""

    step: jax.Array
    params: Any
    model_state: Any
    opt_state: Any
    extras: dict
    key: jax.Array
