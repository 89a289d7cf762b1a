"""Small real runs for trainer tests: scikit-learn digits (bundled, offline), tiny NNX models."""
from __future__ import annotations

import numpy as np
from flax import nnx

from jaxcomposer.data import ArrayLoader, load_digits, normalize_images, DIGITS_MEAN, DIGITS_STD
from jaxcomposer.models import MLP, ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier


def digits(split="train", n=None):
    d = load_digits(split)
    x = normalize_images(d["input"], DIGITS_MEAN, DIGITS_STD)
    y = d["target"]
    if n is not None:
        x, y = x[:n], y[:n]
    return {"input": x, "target": y}


def loaders(batch_size=32, eval_batch_size=100, seed=0, n_train=None):
    train = ArrayLoader(digits("train", n_train), batch_size, shuffle=True, seed=seed, drop_last=True)
    evals = ArrayLoader(digits("test"), eval_batch_size, shuffle=False, drop_last=False)
    return train, evals


def mlp_task(seed=0, dropout=0.0):
    return ComposerClassifier(MLP(64, hidden=(32,), num_classes=10, dropout=dropout, rngs=nnx.Rngs(seed)),
                              num_classes=10)


def resnet_task(seed=0):
    return ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(seed)),
                              num_classes=10)


def leaves(tree):
    import jax
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def stop_at(batch: int):
    """A callback that stops training after ``batch`` without touching the run's plan: what the schedules and
    methods see is an interrupted run (a preemption), not a shorter one."""
    from jaxcomposer import Callback

    class StopAt(Callback):
        def batch_end(self, state, logger):
            if state.timestamp.batch >= batch:
                state.stop_training(f"stop_at({batch})")

    return StopAt()
