"""LowPrecisionLayerNorm.

Method card
-----------
**What it does.** Replaces every LayerNorm with one that runs in the mixed-precision compute dtype (bf16 under
``precision='amp_bf16'``): its input, scale and bias are cast to that dtype and its output is in that dtype,
instead of a LayerNorm that computes and returns float32 inside a bf16 network. Parameters stay float32 (the
optimizer's master weights) and are cast where they are used.

**When it helps.** Mixed-precision training of transformers: a float32 LayerNorm costs twice the memory traffic
of a bf16 one, plus the casts around it. In fp32 runs it does nothing: the replaced layer is bit-identical to the
original.

**Hyperparameters.** ``apply_at`` (default ``'init'``; Composer's ``Event.INIT``, ``BEFORE_LOAD`` or
``AFTER_LOAD``; anything else raises). Here every choice runs the surgery once in the ``model`` slot, which comes
before a checkpoint is loaded; replaced layers keep their parameter paths, so a checkpoint loads either way.

**Exact Composer semantics.** As ``composer/algorithms/low_precision_layernorm``: ``nn.LayerNorm`` ->
``LPLayerNorm`` (a subclass with the same ``weight``/``bias``, copied), whose forward casts ``x``, ``weight`` and
``bias`` to the autocast dtype and calls ``F.layer_norm`` with autocast off; ``apply_low_precision_layernorm(model,
precision)`` warns ``NoEffectWarning`` and returns the model unchanged unless ``precision`` is ``'amp_fp16'`` or
``'amp_bf16'``, and warns when there is no LayerNorm; the engine sorts the method after every other one
(``sort_low_precision_layernorm_last``: here ``order=LAST``). As in torch's bf16 kernels, the mean and variance
accumulate in float32; the result is rounded once to the compute dtype. Differences, with the reason:

- "the autocast dtype" of our Trainer is the dtype its mixed-precision forward gives the parameters (it casts
  params and inputs to bf16, ``jaxcomposer.trainer.step.make_forward``), so the NNX layer computes in the dtype
  its scale/bias arrive in: bf16 under ``amp_bf16``, float32 otherwise.
- the method cannot tell the Trainer's precision: the ``model`` slot's ``RunInfo`` does not carry it. So the
  method always replaces the layers (harmless: in fp32 the new layer is bit-identical) and cannot give
  Composer's fp32 warning; if ``RunInfo`` gains a ``precision`` field, the method reads it and behaves as
  Composer's. The functional form takes ``precision`` as Composer's does.
- with our whole-network AMP a stock ``nnx.LayerNorm`` (``dtype=None``) already receives bf16 inputs and bf16
  params and returns bf16, which is what ``LPLayerNorm`` computes; the method changes the numerics only of
  LayerNorms that run in float32 under AMP (``dtype=jnp.float32``, or an input the model upcast).
- the functional form returns the model in every case (Composer's returns None after a replacement).

**How it plugs in.** ``model`` slot (host, once, before the optimizer is built), ``order=LAST``. NNX
``nnx.LayerNorm`` submodules become :class:`LPLayerNorm` (a subclass sharing the original's ``scale``/``bias``
variables, so parameter paths do not change); torch ``nn.LayerNorm`` modules become Composer's ``LPLayerNorm``
(``torch_bridge.methods.low_precision_layernorm``, registered as ``"LowPrecisionLayerNorm"``). torch.export
records the forward with autocast off, so the exported graph is a plain ``layer_norm``; under ``amp_bf16`` the
bridge runs it on the bf16 params and activations the Trainer gives it, in bf16 (float32 statistics, bf16
output, as torch's kernel). A bridged model that upcasts an activation before its LayerNorm keeps that
LayerNorm in float32: torch's export cannot record "cast to the autocast dtype" without autocast.

**Reference.** Composer: ``composer/algorithms/low_precision_layernorm``.
"""
from __future__ import annotations

from typing import Any

from flax import nnx

from jaxcomposer.algorithms.low_precision_norm import (LAST, LowPrecisionNorm, apply_low_precision_norm, layer_norm_as,
                                                       low_precision_norm_method, low_precision_operands, norm_stats,
                                                       normalize)
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["LowPrecisionLayerNorm", "LPLayerNorm", "apply_low_precision_layernorm", "LAST"]


class LPLayerNorm(nnx.LayerNorm):
    """``nnx.LayerNorm`` computed in its parameters' dtype as they arrive (see
    :func:`~jaxcomposer.algorithms.low_precision_norm.compute_dtype`): input, scale and bias cast to it, statistics
    accumulated in float32 (as flax and torch do), the result in that dtype."""

    @classmethod
    def from_layer_norm(cls, layer: nnx.LayerNorm) -> "LPLayerNorm":
        """The same settings, sharing ``layer``'s ``scale``/``bias`` variables."""
        return layer_norm_as(cls, layer)

    def __call__(self, x, *, mask=None):
        x, scale, bias, low = low_precision_operands(self, x)
        mean, var = norm_stats(x, self.reduction_axes, low, self.axis_name, self.axis_index_groups,
                               use_fast_variance=self.use_fast_variance, mask=mask)
        return normalize(x, mean, var, scale, bias, self.reduction_axes, self.feature_axes, low, self.epsilon)


LAYER_NORM = LowPrecisionNorm("LayerNorm", nnx.LayerNorm, LPLayerNorm, LPLayerNorm.from_layer_norm, order=LAST)


def apply_low_precision_layernorm(model: Any, precision: str | None = None, *, inplace: bool | None = None):
    """Composer's ``apply_low_precision_layernorm(model, precision=None)``: without ``'amp_fp16'`` or
    ``'amp_bf16'`` it warns and returns ``model`` unchanged. A torch module is edited in place and returned; an NNX
    module is cloned and the new model returned unless ``inplace=True``."""
    return apply_low_precision_norm(model, precision, LAYER_NORM, inplace=bool(inplace), stacklevel=3)


def LowPrecisionLayerNorm(apply_at: str = "init") -> Method:
    """Composer's ``LowPrecisionLayerNorm(apply_at=Event.INIT)`` as a :class:`Method` (``model`` slot), sorted
    after every other method."""
    return low_precision_norm_method(LAYER_NORM, apply_at)


ENTRY = MethodEntry(registry_name="low_precision_layernorm", factory=LowPrecisionLayerNorm,
                    functional=(apply_low_precision_layernorm,))
