"""Key plumbing shared by the models: one fresh key per random site, from the single key ``__call__`` receives."""
from __future__ import annotations

import jax


def split_dropout_keys(key: jax.Array | None, n: int, *, active: bool, where: str) -> list[jax.Array | None]:
    """``n`` independent keys for ``n`` dropout sites, or ``n`` Nones when dropout is inactive.

    Inactive means eval mode or rate 0: then ``key`` may be None. When dropout is active a missing key is an error
    rather than a silent fallback, because the pure model must own all of its randomness.
    """
    if not active:
        return [None] * n
    if key is None:
        raise ValueError(f"{where}: train=True with dropout > 0 needs a PRNG key; pass key=jax.random.key(...).")
    return list(jax.random.split(key, n))
