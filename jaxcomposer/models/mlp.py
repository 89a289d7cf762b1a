"""A plain multilayer perceptron: the smallest native model, for smoke tests and tabular / flattened-image tasks."""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys


class MLP(nnx.Module):
    """``Linear -> ReLU -> Dropout`` per hidden width, then a linear head.

    Inputs of any trailing shape are flattened to ``(B, in_features)``, so the same model takes vectors and images.
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (256,), num_classes: int = 10,
                 dropout: float = 0.0, *, rngs: nnx.Rngs):
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP: dropout must be in [0, 1), got {dropout}.")
        self.in_features = in_features
        self.num_classes = num_classes
        self.dropout_rate = dropout
        widths = [in_features, *hidden]
        self.hidden = nnx.List([nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:])])
        self.drop = nnx.Dropout(dropout)
        self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        x = x.reshape(x.shape[0], -1)
        if x.shape[1] != self.in_features:
            raise ValueError(f"MLP: inputs flatten to {x.shape[1]} features, expected in_features={self.in_features}.")
        keys = split_dropout_keys(key, len(self.hidden), active=train and self.dropout_rate > 0, where="MLP")
        for layer, k in zip(self.hidden, keys):
            x = jax.nn.relu(layer(x))
            x = self.drop(x, deterministic=not train, rngs=k)
        return self.head(x).astype(jnp.float32)
