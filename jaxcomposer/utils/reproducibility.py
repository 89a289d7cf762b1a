"""Composer's ``composer.utils.reproducibility``: seed the global generators a script's own code draws from.

jaxcomposer's own randomness never reads a global generator (every draw derives from the run's seed through JAX
keys). What a user's code draws from does: Python's ``random``, numpy's global generator, and torch's (a torch
``DataLoader(shuffle=True)`` shuffles with it). ``Trainer(seed=...)`` calls :func:`seed_all` as Composer's does, so
two runs with the same seed draw the same batches.
"""
from __future__ import annotations

import random

import numpy as np

from jaxcomposer.core import adapters

__all__ = ["seed_all", "get_random_seed"]

_MAX_SEED = 2**32 - 1  # numpy's limit, as Composer's


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and every installed framework's (torch's
    ``manual_seed``), as Composer's ``seed_all``."""
    _check(seed)
    random.seed(seed)
    np.random.seed(seed)
    adapters.seed_frameworks(seed, load=True)


def seed_imported(seed: int) -> None:
    """:func:`seed_all`, except that a framework this process has not imported is left alone (importing torch to
    seed it would cost a JAX-only run seconds, and nothing of it could have drawn yet)."""
    _check(seed)
    random.seed(seed)
    np.random.seed(seed)
    adapters.seed_frameworks(seed, load=False)


def get_random_seed() -> int:
    """A seed drawn from Python's ``random`` (Composer's ``get_random_seed``)."""
    return random.randrange(_MAX_SEED)


def _check(seed: int) -> None:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed_all: seed={seed!r}, expected an int in [0, 2**32 - 1] (numpy's range)")
