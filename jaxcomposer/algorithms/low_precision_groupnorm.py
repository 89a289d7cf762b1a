"""LowPrecisionGroupNorm.

Method card
-----------
**What it does.** Replaces every GroupNorm with one that runs in the mixed-precision compute dtype (bf16 under
``precision='amp_bf16'``): its input, scale and bias are cast to that dtype and its output is in that dtype,
instead of a GroupNorm computing and returning float32 inside a bf16 network. Parameters stay float32 (the
optimizer's master weights) and are cast where they are used.

**When it helps.** Mixed-precision training of networks with GroupNorm (diffusion U-Nets, some detection
backbones): half the memory traffic of a float32 GroupNorm, and no casts around it. In fp32 runs it does nothing:
the replaced layer is bit-identical to the original.

**Hyperparameters.** ``apply_at`` (default ``'init'``; Composer's ``Event.INIT``, ``BEFORE_LOAD`` or
``AFTER_LOAD``; anything else raises). Every choice runs the surgery once in the ``model`` slot, before a
checkpoint is loaded; parameter paths do not change.

**Exact Composer semantics.** As ``composer/algorithms/low_precision_groupnorm``: ``nn.GroupNorm`` ->
``LPGroupNorm`` (same groups, eps, affine, weights copied) whose forward casts ``x``, ``weight`` and ``bias`` to
the autocast dtype and calls ``F.group_norm`` with autocast off; ``apply_low_precision_groupnorm(model,
precision)`` warns ``NoEffectWarning`` and returns the model unchanged unless ``precision`` is ``'amp_fp16'`` or
``'amp_bf16'``, and warns when there is no GroupNorm. Unlike LowPrecisionLayerNorm, Composer's engine does not
reorder it (``order`` 0). Statistics accumulate in float32, as in torch's bf16 kernels. The differences from
Composer are LowPrecisionLayerNorm's, for the same reasons (see :mod:`jaxcomposer.algorithms.low_precision_layernorm`):
the compute dtype is the dtype the parameters arrive in; the method cannot read the Trainer's precision from
``RunInfo``, so it always replaces (bit-identical in fp32) and cannot warn in fp32 runs; the functional form
returns the model.

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built). NNX ``nnx.GroupNorm`` submodules
become :class:`LPGroupNorm` (a subclass sharing the original's ``scale``/``bias`` variables); torch
``nn.GroupNorm`` modules become Composer's ``LPGroupNorm`` (``torch_bridge.methods.low_precision_groupnorm``,
registered as ``"LowPrecisionGroupNorm"``), exported as a plain ``group_norm`` that the bridge runs on the bf16
params and activations the Trainer gives it under ``amp_bf16``.

**Reference.** Composer: ``composer/algorithms/low_precision_groupnorm``.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx

from jaxcomposer.algorithms.low_precision_norm import (LowPrecisionNorm, apply_low_precision_norm, canonical_axes,
                                                       low_precision_norm_method, low_precision_operands, norm_stats,
                                                       normalize, share_affine)
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["LowPrecisionGroupNorm", "LPGroupNorm", "apply_low_precision_groupnorm"]


class LPGroupNorm(nnx.GroupNorm):
    """``nnx.GroupNorm`` computed in its parameters' dtype as they arrive: input, scale and bias cast to it,
    statistics accumulated in float32, the result in that dtype."""

    @classmethod
    def from_group_norm(cls, layer: nnx.GroupNorm) -> "LPGroupNorm":
        """The same settings, sharing ``layer``'s ``scale``/``bias`` variables."""
        new = cls(layer.num_groups * layer.group_size, layer.num_groups, epsilon=layer.epsilon, dtype=layer.dtype,
                  param_dtype=layer.param_dtype, use_bias=False, use_scale=False,
                  reduction_axes=layer.reduction_axes, axis_name=layer.axis_name,
                  axis_index_groups=layer.axis_index_groups, use_fast_variance=layer.use_fast_variance,
                  promote_dtype=layer.promote_dtype, rngs=nnx.Rngs(0))
        return share_affine(new, layer)

    def __call__(self, x, *, mask=None):
        # nnx.GroupNorm.__call__ with every operand cast to the compute dtype
        x, scale, bias, low = low_precision_operands(self, x)
        axes = self.reduction_axes if self.reduction_axes is not None else list(range(1, x.ndim - 1)) + [-1]
        axes = canonical_axes(x.ndim, axes)
        group_shape = x.shape[:-1] + (self.num_groups, self.group_size)
        if mask is not None:
            mask = mask.reshape(mask.shape[:-1] + (self.num_groups, self.group_size))
        mean, var = norm_stats(x.reshape(group_shape), list(axes[:-1]) + [-1], low, self.axis_name,
                               self.axis_index_groups, use_fast_variance=self.use_fast_variance, mask=mask)
        mean = jnp.repeat(mean, self.group_size, axis=1)
        var = jnp.repeat(var, self.group_size, axis=1)
        return normalize(x, mean, var, scale, bias, axes[:-1], (self.feature_axis,), low, self.epsilon)


GROUP_NORM = LowPrecisionNorm("GroupNorm", nnx.GroupNorm, LPGroupNorm, LPGroupNorm.from_group_norm)


def apply_low_precision_groupnorm(model: Any, precision: str | None = None, *, inplace: bool | None = None):
    """Composer's ``apply_low_precision_groupnorm(model, precision=None)``: without ``'amp_fp16'`` or
    ``'amp_bf16'`` it warns and returns ``model`` unchanged. A torch module is edited in place and returned; an NNX
    module is cloned and the new model returned unless ``inplace=True``."""
    return apply_low_precision_norm(model, precision, GROUP_NORM, inplace=bool(inplace), stacklevel=3)


def LowPrecisionGroupNorm(apply_at: str = "init") -> Method:
    """Composer's ``LowPrecisionGroupNorm(apply_at=Event.INIT)`` as a :class:`Method` (``model`` slot)."""
    return low_precision_norm_method(GROUP_NORM, apply_at)


ENTRY = MethodEntry(registry_name="low_precision_groupnorm", factory=LowPrecisionGroupNorm,
                    functional=(apply_low_precision_groupnorm,))
