"""Key plumbing shared by the models: one fresh key per random site, from the single key ``__call__`` receives."""
from __future__ import annotations

import jax


def split_dropout_keys(key: jax.Array | None, n: int, *, active: bool, where: str) -> list[jax.Array | None]:
    """``n`` independent keys for ``n`` dropout sites from ``key``, or ``n`` Nones when there is no key.

    Inactive dropout (eval mode or rate 0) may go without a key. When dropout is active a missing key is an error
    rather than a silent fallback, because the pure model must own all of its randomness. A key given is always
    split, active or not: a layer that replaced the model's dropout (GyroDropout) may need one where a rate-0
    ``nnx.Dropout`` did not, and unused keys cost nothing under jit.
    """
    if key is None:
        if active:
            raise ValueError(f"{where}: train=True with dropout > 0 needs a PRNG key; pass key=jax.random.key(...).")
        return [None] * n
    return list(jax.random.split(key, n))
