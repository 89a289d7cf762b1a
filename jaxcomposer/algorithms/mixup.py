"""MixUp.

Method card
-----------
**What it does.** Trains on convex combinations of pairs of examples: ``x = (1 - lam) * x + lam * x[perm]`` with
targets ``(1 - lam) * onehot(y) + lam * onehot(y[perm])``. ``lam = min(z, 1 - z)``, ``z ~ Beta(alpha, alpha)``, one
draw per batch, so ``lam <= 0.5`` and the "main" label is always the original one (training accuracy stays
meaningful).

**When it helps.** Image classification trained long enough to overfit (ImageNet ResNets >= ~90 epochs, CIFAR):
regularizes and improves calibration. Slows convergence on short schedules; not for language models.

**Hyperparameters.** ``alpha`` (default ``0.2``; ``0`` means ``lam = 0``, i.e. no mixing); ``interpolate_loss``
(default ``False``): when ``True`` the loss is ``(1 - lam) * L(y) + lam * L(y[perm])`` instead of the loss on mixed
targets (identical for cross-entropy, but works for losses that need index targets).

**How it plugs in.** ``batch`` slot (``batch(batch, ctx)``, drawing from its own ``ctx.key``; docs/design.md,
"Methods and slots"): mixes ``batch['input']`` and stores, per example so that microbatch splits
along axis 0 stay correct, ``batch['mixup/target_perm']`` (the permuted targets) and ``batch['mixup/mixing']``
(``lam`` broadcast to shape ``(B,)``). ``loss`` slot: uses them; without those keys (evaluation) it is the
identity. Declares ``exclusive={"interpolates_targets"}``, so ``compose`` raises if any other method of the
recipe also interpolates targets (CutMix).

**Functional form.** ``mixup_batch(input, target, mixing=None, alpha=0.2, indices=None, *, key=None)``: Composer's
positional arguments (``cf.mixup_batch(x, y, 0.3, key=key)`` mixes by 0.3 as Composer's ``cf.mixup_batch(x, y,
0.3)``), JAX, numpy or torch arrays in, the same type out (:mod:`jaxcomposer.algorithms.functional_io`), and
``mixing`` out as a Python float as Composer's (a 0-d array only when traced, under ``jax.jit``). One
deliberate difference: Composer draws ``mixing`` and the permutation from numpy's and torch's global generators,
ours from the keyword-only ``key``, so a call without ``key`` raises unless both ``mixing`` and ``indices`` are
given (which reproduces any draw of Composer's exactly).

**Reference.** Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR 2018 (arXiv:1710.09412).
Composer: ``composer/algorithms/mixup``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.sampling import symmetric_beta
from jaxcomposer.core.method import Method, MethodEntry, StepCtx
from jaxcomposer.loss import ensure_targets_one_hot

__all__ = ["mixup_batch", "MixUp", "MIXING_KEY", "TARGET_PERM_KEY"]

TARGET_PERM_KEY = "mixup/target_perm"
MIXING_KEY = "mixup/mixing"


def _gen_mixing_coef(key: jax.Array, alpha: float) -> jax.Array:
    if alpha == 0:  # Beta(0, 0) is undefined; Composer treats alpha=0 as "no mixing".
        return jnp.zeros((), jnp.float32)
    z = symmetric_beta(key, alpha)
    # Beta(a, a) is symmetric, so folding onto [0, 0.5] keeps the distribution of the pair and the original label main.
    return jnp.minimum(z, 1.0 - z)


@functional_form(arrays=("input", "target", "mixing", "indices"))
def mixup_batch(input: jax.Array, target: jax.Array, mixing=None, alpha: float = 0.2,
                indices: jax.Array | None = None, *, key: jax.Array | None = None):
    """Composer's ``mixup_batch(input, target, mixing=None, alpha=0.2, indices=None)``: returns ``(mixed_input,
    target[perm], mixing)`` with ``mixed_input = (1 - mixing) * input + mixing * input[perm]``.

    ``mixing`` (a scalar) and ``indices`` (a permutation of ``range(B)``) are drawn from ``key`` (keyword-only)
    when not given, so ``key`` is needed unless both are. Arrays come back in the caller's type
    (:mod:`jaxcomposer.algorithms.functional_io`). ``mixing`` comes back as a Python ``float``, as Composer's, for
    JAX, numpy and torch callers alike, except under a JAX transformation (``jax.jit``, ``vmap``, ``grad``), where
    it is traced and stays a 0-d JAX array (a float would need its value, which a trace does not have).
    """
    if alpha < 0:
        raise ValueError(f"mixup_batch: alpha must be >= 0, got {alpha}.")
    if mixing is None or indices is None:
        key = require_key(key, "mixup_batch", "the mixing coefficient and the permutation (pass both mixing= "
                                        "and indices= to draw nothing)")
        k_mix, k_perm = jax.random.split(key)
    mixing = _gen_mixing_coef(k_mix, alpha) if mixing is None else jnp.asarray(mixing, jnp.float32)
    if mixing.ndim != 0:
        raise ValueError(f"mixup_batch: mixing must be a scalar, got an array of shape {mixing.shape}.")
    indices = jax.random.permutation(k_perm, input.shape[0]) if indices is None else jnp.asarray(indices)
    # Integer images cannot hold a blend; everything else mixes in its own dtype (bf16 stays bf16).
    dtype = input.dtype if jnp.issubdtype(input.dtype, jnp.floating) else jnp.float32
    x, lam = input.astype(dtype), mixing.astype(dtype)
    mixed = (1 - lam) * x + lam * x[indices]
    if not isinstance(mixing, jax.core.Tracer):
        mixing = float(mixing)  # Composer returns the float it drew or was given, not a tensor
    return mixed, target[indices], mixing


def _per_example(lam: jax.Array, like: jax.Array) -> jax.Array:
    # (B,) -> (B, 1, ..., 1): explicit, because the suite forbids implicit rank promotion.
    return lam.reshape(lam.shape + (1,) * (like.ndim - 1))


def MixUp(alpha: float = 0.2, interpolate_loss: bool = False, input_key: str = "input",
          target_key: str = "target") -> Method:
    """Composer's ``MixUp(alpha=0.2, interpolate_loss=False)`` as a :class:`Method` (``batch`` + ``loss`` slots)."""
    alpha = float(alpha)
    if alpha < 0:
        raise ValueError(f"MixUp: alpha must be >= 0, got {alpha}.")

    def batch_fn(batch: dict, ctx: StepCtx) -> dict:
        x = batch[input_key]
        mixed, target_perm, lam = mixup_batch(x, batch[target_key], alpha=alpha, key=ctx.key)
        return {**batch, input_key: mixed, TARGET_PERM_KEY: target_perm,
                MIXING_KEY: jnp.full((x.shape[0],), lam, jnp.float32)}

    def wrap(loss_fn: Callable, ctx: StepCtx) -> Callable:
        del ctx  # the mixing travels in the batch (per example), not in the ctx

        def mixed_loss(outputs, batch):
            if MIXING_KEY not in batch:  # evaluation, or a batch this method did not see: identity.
                return loss_fn(outputs, batch)
            lam, target_perm = batch[MIXING_KEY], batch[TARGET_PERM_KEY]
            rest = {k: v for k, v in batch.items() if k not in (MIXING_KEY, TARGET_PERM_KEY)}
            if interpolate_loss:
                return ((1 - lam) * loss_fn(outputs, rest)
                        + lam * loss_fn(outputs, {**rest, target_key: target_perm}))
            y = ensure_targets_one_hot(outputs, rest[target_key])
            y_perm = ensure_targets_one_hot(outputs, target_perm)
            lam_t = _per_example(lam, y)
            return loss_fn(outputs, {**rest, target_key: (1 - lam_t) * y + lam_t * y_perm})

        return mixed_loss

    return Method(name="MixUp", batch=batch_fn, loss=wrap, exclusive={"interpolates_targets"},
                  description=f"MixUp(alpha={alpha}, interpolate_loss={interpolate_loss})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="mixup", factory=MixUp, functional=(mixup_batch,))
