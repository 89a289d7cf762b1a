"""Per-example losses (Composer's ``composer.loss``): cross-entropy with index or dense targets, binary
cross-entropy, and ``ensure_targets_one_hot``. Per example (shape ``(B,)``), so microbatching, padding masks and
MixUp's interpolation are weighted sums; the trainer and the metrics reduce them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ensure_targets_one_hot", "index_cross_entropy", "soft_binary_cross_entropy", "soft_cross_entropy"]


def soft_cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Per-example cross-entropy with integer class targets ``(B,)`` or dense (soft) targets ``(B, C)``.

    Composer's ``soft_cross_entropy`` without the reduction: index targets give ``F.cross_entropy``, dense
    targets give ``-(t * log_softmax(x)).sum(-1)``. Computed in float32 whatever the logits' dtype; index targets
    go through :func:`index_cross_entropy` (first-order only, see there).
    """
    if jnp.issubdtype(target.dtype, jnp.integer):
        return index_cross_entropy(logits, target)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -(target.astype(jnp.float32) * logp).sum(-1)


@jax.custom_vjp
def index_cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """``logsumexp(x) - x[target]`` over the last axis, in float32: ``(..., C)`` logits, ``(...)`` int targets.

    Its gradient is written out, ``(softmax(x) - onehot(target)) * g``, because autodiff of ``log_softmax`` and
    ``take_along_axis`` builds it from a zero-filled float32 array of the logits' shape, a scatter into it, a
    reduction over it and a final pass: four trips through the largest tensor of a language model's step (16 x
    1024 x 50304 floats for GPT-2; benchmarks/gpu_profile.py measured what they cost). Written out it is one pass
    that reads the logits, in their own dtype, and writes the gradient. The cost: forward-mode autodiff (``jax.jvp``,
    ``jax.hessian``) does not go through it; ``jax.grad`` of ``jax.grad`` does.
    """
    return _index_ce_forward(logits, target)[0]


def _index_ce_forward(logits, target):
    x = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(x, axis=-1)
    picked = jnp.take_along_axis(x, target[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return lse - picked, (logits, target, lse)


def _index_ce_backward(residuals, g):
    logits, target, lse = residuals
    x = logits.astype(jnp.float32)
    classes = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    onehot = (classes == target[..., None].astype(jnp.int32)).astype(jnp.float32)
    grad = (jnp.exp(x - lse[..., None]) - onehot) * g[..., None]
    return grad.astype(logits.dtype), np.zeros(target.shape, jax.dtypes.float0)


index_cross_entropy.defvjp(_index_ce_forward, _index_ce_backward)


def soft_binary_cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Per-example binary cross-entropy summed over the classes, with integer ``(B,)`` or dense ``(B, C)`` targets.

    The mean over a batch is Composer's ``binary_cross_entropy_with_logits(..., reduction='sum',
    scale_by_batch_size=True)``, the loss of its ResNet-50 recipes: each class an independent sigmoid, index
    targets made one-hot first (``ensure_targets_one_hot``), so label smoothing and MixUp's dense targets apply.
    """
    x = logits.astype(jnp.float32)
    t = ensure_targets_one_hot(x, target).astype(jnp.float32)
    # log(1 + exp(-|x|)) + max(x, 0) - x * t: the stable form of torch's binary_cross_entropy_with_logits
    return (jnp.maximum(x, 0) - x * t + jnp.log1p(jnp.exp(-jnp.abs(x)))).sum(-1)


def ensure_targets_one_hot(logits: jax.Array, target: jax.Array, num_classes: int | None = None) -> jax.Array:
    """Composer's ``ensure_targets_one_hot``: class indices become float one-hot over the last logit axis. As in
    Composer, the shape decides: targets shaped like the logits are already dense (integer one-hot included)."""
    if target.shape != logits.shape:
        n = num_classes if num_classes is not None else logits.shape[-1]
        return jax.nn.one_hot(target, n, dtype=jnp.float32)
    return target.astype(jnp.float32)
