"""Gradient clipping: by global norm, by value, or adaptive (unit-wise AGC).

Method card
-----------
**What it does.** Bounds the gradient before the optimizer sees it.

- ``'norm'``: ``torch.nn.utils.clip_grad_norm_``: ``g *= min(thr / (||g||_global + 1e-6), 1)``.
- ``'value'``: ``torch.nn.utils.clip_grad_value_``: ``g = clip(g, -thr, thr)`` elementwise.
- ``'adaptive'``: Adaptive Gradient Clipping (Brock et al. 2021), per parameter and per output unit, as
  Composer's ``_get_clipped_gradient_coeff``::

      coeff = min(thr * unitwise_norm(p) / unitwise_norm(g), 1)      # 0 / 0 -> 1, as Composer's NaN -> 1
      g     = g * coeff

  ``eps`` (keyword-only, default ``0.0``: Composer's rule) floors the weight norm first,
  ``max(unitwise_norm(p), eps)``, as the paper's NFNet code does with ``eps=1e-3``. Without a floor a unit whose
  weights are all zero gets a zero gradient and never leaves zero; Flax initializes biases and norm offsets to
  zero (torch's default inits rarely are), so pass ``eps=1e-3`` to train such units of an NNX model under AGC.

**Unit-wise norm and layout.** A "unit" is one output neuron/filter. torch stores output units on axis 0
(Linear ``(out, in)``, Conv ``(out, in, kh, kw)``) and Composer reduces over axes ``1..``; Flax stores them on the
**last** axis (Dense ``(in, out)``, Conv ``(kh, kw, in, out)``), so we reduce over every axis except the last.
Tensors with ``ndim <= 1`` (biases, scales, scalars) use one norm over the whole tensor, as Composer does.
In the Trainer the method reads the layout from the model (``ctx.model.unit_axis``): axis 0 for a bridged torch
model, whose weights keep their ``state_dict`` layout, the last axis for NNX; ``unit_axis=`` forces one. The
functional form on a pytree defaults to the Flax layout (``unit_axis=-1``); pass ``unit_axis=0`` for torch-layout
trees.

**When it helps.** ``'norm'`` is the standard guard against loss spikes (transformers: ``1.0``). ``'adaptive'``
lets normalizer-free nets and large-batch training run at high learning rates (NFNets: ``thr=0.01``-``0.16``).

**Hyperparameters.** ``clipping_type`` in ``{'norm', 'value', 'adaptive'}`` and ``clipping_threshold > 0`` (both
required, as in Composer).

**How it plugs in.** A ``tx`` slot, ``tx(optax_tx, ctx) -> optax.chain(clip, optax_tx)`` (docs/design.md, "Methods
and slots"), so clipping sees the full (accumulated over microbatches) gradient, after loss scaling is undone,
right before the optimizer: Composer's ``AFTER_TRAIN_BATCH``. The clip is stateless and does not depend on the
step, so it reads nothing from the ctx; rebuilding it inside every step costs nothing.

**Functional form.** ``apply_gradient_clipping(grads, clipping_type, clipping_threshold, params=None, *,
eps=0.0, unit_axis=-1)`` is pure on gradient pytrees (JAX, numpy or torch arrays; the caller's type comes back).
Called as Composer's ``apply_gradient_clipping(model, clipping_type, clipping_threshold, fsdp_enabled)`` on a torch
module, it clips the module's ``.grad`` in place as Composer's does (axis 0 units, no ``eps``);
``fsdp_enabled=True`` is refused, since no torch FSDP module runs here. Where Composer's fourth positional argument
is ``fsdp_enabled``, a pytree call's is ``params`` (the adaptive rule needs them and a pytree has no ``.grad`` to
read them from).

**Reference.** Pascanu et al., "On the difficulty of training recurrent neural networks", ICML 2013
(arXiv:1211.5063); Brock et al., "High-Performance Large-Scale Image Recognition Without Normalization", ICML 2021
(arXiv:2102.06171). Composer: ``composer/algorithms/gradient_clipping``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["apply_gradient_clipping", "clip_gradients", "unitwise_norm", "GradientClipping"]

CLIPPING_TYPES = ("norm", "value", "adaptive")


def check_clipping_args(clipping_type: str, clipping_threshold: float) -> None:
    if clipping_type not in CLIPPING_TYPES:
        raise ValueError(f"GradientClipping: clipping_type must be one of {CLIPPING_TYPES}, got {clipping_type!r}.")
    if not clipping_threshold > 0:
        raise ValueError(f"GradientClipping: clipping_threshold must be > 0, got {clipping_threshold}.")


def unitwise_norm(x: jax.Array, unit_axis: int = -1) -> jax.Array:
    """L2 norm per output unit (keepdims, broadcastable to ``x``); one norm for ``ndim <= 1``."""
    x = x.astype(jnp.float32)
    if x.ndim <= 1:
        return jnp.sqrt(jnp.sum(x * x))
    unit_axis = unit_axis % x.ndim
    axes = tuple(a for a in range(x.ndim) if a != unit_axis)
    return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=True))


def _clip_norm(grads, thr: float):
    leaves = jax.tree_util.tree_leaves(grads)
    total = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in leaves))
    coef = jnp.minimum(thr / (total + 1e-6), 1.0)  # torch always multiplies, even by exactly 1
    return jax.tree_util.tree_map(lambda g: (g * coef).astype(g.dtype), grads)


def _agc_leaf(g: jax.Array, p: jax.Array, thr: float, eps: float, unit_axis: int) -> jax.Array:
    param_norm = unitwise_norm(p, unit_axis)
    if eps:
        param_norm = jnp.maximum(param_norm, eps)
    max_norm = param_norm * thr
    grad_norm = unitwise_norm(g, unit_axis)
    # grad_norm > max_norm >= 0 wherever the ratio is used, so the guard only keeps the other branch finite
    coeff = jnp.where(grad_norm > max_norm, max_norm / jnp.where(grad_norm > 0, grad_norm, 1.0), 1.0)
    return (g.astype(jnp.float32) * coeff).astype(g.dtype)


@functional_form(arrays=("grads", "params"), models=("grads",))
def apply_gradient_clipping(grads, clipping_type: str, clipping_threshold: float, params=None, *,
                            eps: float = 0.0, unit_axis: int = -1):
    """Composer's ``apply_gradient_clipping`` on a gradient pytree; returns the clipped pytree.

    ``params`` (same structure as ``grads``) is required for ``'adaptive'``; ``eps`` and ``unit_axis`` only matter
    there (see the module docstring for the layout convention; ``eps`` > 0 floors the weight norm, which
    Composer does not). On a torch
    module it is Composer's ``apply_gradient_clipping(model, clipping_type, clipping_threshold, fsdp_enabled)``:
    the ``.grad`` of its parameters are clipped in place (``torch_bridge.functional.apply_gradient_clipping``).
    """
    check_clipping_args(clipping_type, clipping_threshold)
    thr = float(clipping_threshold)
    if clipping_type == "norm":
        return _clip_norm(grads, thr)
    if clipping_type == "value":
        return jax.tree_util.tree_map(lambda g: jnp.clip(g, -thr, thr), grads)
    if params is None:
        raise ValueError("GradientClipping: clipping_type='adaptive' needs the parameters (unit-wise ratio "
                         "||grad|| / ||param||); pass params=..., or call the optax update with params.")
    return jax.tree_util.tree_map(lambda g, p: _agc_leaf(g, p, thr, eps, unit_axis), grads, params)


def clip_gradients(clipping_type: str, clipping_threshold: float, *, eps: float = 0.0,
                   unit_axis: int = -1) -> optax.GradientTransformation:
    """The optax transformation behind :func:`GradientClipping` (stateless; uses ``params`` for 'adaptive')."""
    check_clipping_args(clipping_type, clipping_threshold)

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        return apply_gradient_clipping(updates, clipping_type, clipping_threshold, params,
                                       eps=eps, unit_axis=unit_axis), state

    return optax.GradientTransformation(init, update)


def GradientClipping(clipping_type: str, clipping_threshold: float, *, eps: float = 0.0,
                     unit_axis: int | None = None) -> Method:
    """Composer's ``GradientClipping(clipping_type, clipping_threshold)`` as a :class:`Method` (``tx`` slot).

    ``unit_axis=None`` takes the model's layout from the step (:attr:`ModelView.unit_axis`: 0 for a bridged torch
    model, -1 for NNX); an int forces one axis for every weight. ``eps`` (``'adaptive'`` only; default ``0.0``,
    Composer's rule) floors each unit's weight norm: ``eps=1e-3`` (the paper's) keeps zero-initialized units
    (Flax's biases) training."""
    clip_gradients(clipping_type, clipping_threshold, eps=eps)  # validate now, not at trace time

    def tx_fn(tx, ctx):
        axis = ctx.model.unit_axis if unit_axis is None else unit_axis
        return optax.chain(clip_gradients(clipping_type, clipping_threshold, eps=eps, unit_axis=axis), tx)

    return Method(name="GradientClipping", tx=tx_fn,
                  description=f"GradientClipping(clipping_type={clipping_type!r}, "
                              f"clipping_threshold={clipping_threshold})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="gradient_clipping", factory=GradientClipping, functional=(apply_gradient_clipping,))
