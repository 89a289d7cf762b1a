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

import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn.normalization import _compute_stats, _normalize

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["LowPrecisionLayerNorm", "LPLayerNorm", "apply_low_precision_layernorm", "LAST"]

LAST = 1_000  # Method.order that sorts after every other method (Composer's sort_low_precision_layernorm_last)
LOW_PRECISIONS = ("amp_fp16", "amp_bf16")
APPLY_AT = ("init", "before_load", "after_load")
UNKNOWN_PRECISION = object()  # a precision not known (a model slot called outside a Trainer): apply, do not warn


def run_precision(ctx) -> Any:
    """The Trainer's precision the ``model`` slot sees, or ``UNKNOWN_PRECISION`` outside a Trainer."""
    return UNKNOWN_PRECISION if ctx.run.precision is None else ctx.run.precision


def compute_dtype(x: jax.Array, *params: Any) -> Any:
    """The mixed-precision compute dtype as a norm layer sees it: its parameters' dtype as the step gives them
    (bf16 under our AMP), or the input's when it has no parameters."""
    for p in params:
        if p is not None:
            return p.dtype
    return x.dtype


def scale_and_bias(layer) -> tuple[Any, Any]:
    return (layer.scale[...] if layer.scale is not None else None,
            layer.bias[...] if layer.bias is not None else None)


def cast_or_none(v: Any, dtype) -> Any:
    return None if v is None else v.astype(dtype)


def layer_norm_as(cls: type, layer: nnx.LayerNorm) -> nnx.LayerNorm:
    """``layer`` rebuilt as its subclass ``cls``: the same settings, sharing ``layer``'s ``scale``/``bias``
    variables (so parameter paths and values do not change)."""
    new = cls(layer.num_features, epsilon=layer.epsilon, dtype=layer.dtype, param_dtype=layer.param_dtype,
              use_bias=False, use_scale=False, reduction_axes=layer.reduction_axes,
              feature_axes=layer.feature_axes, axis_name=layer.axis_name,
              axis_index_groups=layer.axis_index_groups, use_fast_variance=layer.use_fast_variance,
              promote_dtype=layer.promote_dtype, rngs=nnx.Rngs(0))
    new.use_bias, new.use_scale = layer.use_bias, layer.use_scale
    new.scale, new.bias = layer.scale, layer.bias
    return new


class LPLayerNorm(nnx.LayerNorm):
    """``nnx.LayerNorm`` computed in its parameters' dtype as they arrive (see :func:`compute_dtype`): input, scale
    and bias cast to it, statistics accumulated in float32 (as flax and torch do), the result in that dtype."""

    @classmethod
    def from_layer_norm(cls, layer: nnx.LayerNorm) -> "LPLayerNorm":
        """The same settings, sharing ``layer``'s ``scale``/``bias`` variables."""
        return layer_norm_as(cls, layer)

    def __call__(self, x, *, mask=None):
        scale, bias = scale_and_bias(self)
        low = compute_dtype(x, scale, bias)
        x, scale, bias = x.astype(low), cast_or_none(scale, low), cast_or_none(bias, low)
        mean, var = _compute_stats(x, self.reduction_axes, low, self.axis_name, self.axis_index_groups,
                                   use_fast_variance=self.use_fast_variance, mask=mask)
        return _normalize(x, mean, var, scale, bias, self.reduction_axes, self.feature_axes, low, self.epsilon)


def replace_norms(model: nnx.Module, norm_type: type, lp_type: type, convert: Callable, inplace: bool):
    """``(model or its clone, low-precision norms in it)``: every ``norm_type`` submodule that is not already
    ``lp_type`` becomes ``convert(norm)``, in every parent that holds it. As BlurPool, the count is of the result,
    so a model converted before does not warn again."""
    new = model if inplace else nnx.clone(model)
    replace_modules(new, lambda m: isinstance(m, norm_type) and not isinstance(m, lp_type),
                    lambda norm, i: convert(norm))
    return new, sum(isinstance(m, lp_type) for _, m in nnx.iter_graph(new))


def check_apply_at(where: str, apply_at: Any) -> str:
    value = getattr(apply_at, "value", apply_at)
    value = value.lower() if isinstance(value, str) else value
    if value not in APPLY_AT:
        raise ValueError(f"{where} only supports application on Event.INIT, Event.BEFORE_LOAD and Event.AFTER_LOAD "
                         f"({', '.join(repr(a) for a in APPLY_AT)}), got {apply_at!r}.")
    return value


def apply_low_precision_norm(model: Any, precision: Any, *, method: str, norm_name: str, nnx_types: tuple,
                             convert: Callable, inplace: bool, stacklevel: int):
    """The shared body of the two functional forms: Composer's precision check, the NNX or torch surgery and its
    warnings."""
    if precision is not UNKNOWN_PRECISION and getattr(precision, "value", precision) not in LOW_PRECISIONS:
        warnings.warn(NoEffectWarning(f"Low Precision {norm_name} only applies to AMP_FP16 and AMP_BF16 precisions "
                                      f"(got precision={precision!r})."), stacklevel=stacklevel)
        return model
    new, n = apply_surgery(method, model, lambda m: replace_norms(m, *nnx_types, convert, inplace),
                           who=f"apply_low_precision_{norm_name.lower()}")
    if n == 0:
        warnings.warn(NoEffectWarning(f"No instances of {norm_name} (nnx.{norm_name} / torch.nn.{norm_name}) found "
                                      f"in {type(model).__name__}."), stacklevel=stacklevel)
    return new


def apply_low_precision_layernorm(model: Any, precision: str | None = None, *, inplace: bool | None = None):
    """Composer's ``apply_low_precision_layernorm(model, precision=None)``: without ``'amp_fp16'`` or
    ``'amp_bf16'`` it warns and returns ``model`` unchanged. A torch module is edited in place and returned; an NNX
    module is cloned and the new model returned unless ``inplace=True``."""
    return apply_low_precision_norm(model, precision, method="LowPrecisionLayerNorm", norm_name="LayerNorm",
                                    nnx_types=(nnx.LayerNorm, LPLayerNorm), convert=LPLayerNorm.from_layer_norm,
                                    inplace=bool(inplace), stacklevel=3)


def LowPrecisionLayerNorm(apply_at: str = "init") -> Method:
    """Composer's ``LowPrecisionLayerNorm(apply_at=Event.INIT)`` as a :class:`Method` (``model`` slot), sorted
    after every other method."""
    check_apply_at("LowPrecisionLayerNorm", apply_at)

    def model_fn(task, ctx):  # in place, as Composer
        new = apply_low_precision_norm(
            task.source, run_precision(ctx), method="LowPrecisionLayerNorm",
            norm_name="LayerNorm", nnx_types=(nnx.LayerNorm, LPLayerNorm), convert=LPLayerNorm.from_layer_norm,
            inplace=True, stacklevel=4)
        return task.with_model(new)

    return Method(name="LowPrecisionLayerNorm", model=model_fn, order=LAST,
                  description=f"LowPrecisionLayerNorm(apply_at={apply_at!r})")


ENTRY = MethodEntry(registry_name="low_precision_layernorm", factory=LowPrecisionLayerNorm,
                    functional=(apply_low_precision_layernorm,))
