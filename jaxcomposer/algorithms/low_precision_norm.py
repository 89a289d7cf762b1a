"""What LowPrecisionLayerNorm and LowPrecisionGroupNorm share (and FusedLayerNorm's surgery reuses): Composer's
precision and ``apply_at`` checks, the NNX-or-torch surgery with its warnings, the compute dtype, and the statistics
and normalization their layers compute. Not a method: it has no ``ENTRY``.

:func:`norm_stats` and :func:`normalize` are our own, written to the formulas of flax's ``nnx.LayerNorm`` and
``nnx.GroupNorm`` (float32 accumulation, the fast variance clipped at zero, one ``pmean`` over ``axis_name``, the
mask), because flax keeps its helpers private and moves them between releases. The tests hold the low-precision
layers bit-identical to flax's in float32.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
from jax import lax
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method

__all__ = ["LAST", "LOW_PRECISIONS", "APPLY_AT", "UNKNOWN_PRECISION", "run_precision", "compute_dtype",
           "scale_and_bias", "cast_or_none", "low_precision_operands", "layer_norm_as", "share_affine",
           "replace_norms", "check_apply_at", "LowPrecisionNorm", "apply_low_precision_norm",
           "low_precision_norm_method", "canonical_axes", "norm_stats", "normalize"]

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


def low_precision_operands(layer, x: jax.Array) -> tuple[jax.Array, Any, Any, Any]:
    """``(x, scale, bias, compute dtype)``: ``layer``'s input and affine parameters cast to the dtype its
    parameters arrive in (:func:`compute_dtype`)."""
    scale, bias = scale_and_bias(layer)
    low = compute_dtype(x, scale, bias)
    return x.astype(low), cast_or_none(scale, low), cast_or_none(bias, low), low


def layer_norm_as(cls: type, layer: nnx.LayerNorm) -> nnx.LayerNorm:
    """``layer`` rebuilt as its subclass ``cls``: the same settings, sharing ``layer``'s ``scale``/``bias``
    variables (so parameter paths and values do not change)."""
    new = cls(layer.num_features, epsilon=layer.epsilon, dtype=layer.dtype, param_dtype=layer.param_dtype,
              use_bias=False, use_scale=False, reduction_axes=layer.reduction_axes,
              feature_axes=layer.feature_axes, axis_name=layer.axis_name,
              axis_index_groups=layer.axis_index_groups, use_fast_variance=layer.use_fast_variance,
              promote_dtype=layer.promote_dtype, rngs=nnx.Rngs(0))
    return share_affine(new, layer)


def share_affine(new: nnx.Module, layer: nnx.Module) -> nnx.Module:
    """``new`` (built with ``use_bias=False, use_scale=False``, so it draws no parameters of its own) holding
    ``layer``'s ``scale``/``bias`` variables and flags."""
    new.use_bias, new.use_scale = layer.use_bias, layer.use_scale
    new.scale, new.bias = layer.scale, layer.bias
    return new


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


class LowPrecisionNorm(NamedTuple):
    """One low-precision norm method: the norm it replaces (``norm_name``, Composer's spelling: ``"LayerNorm"``), the
    flax class of that norm, its low-precision subclass and ``convert(norm) -> low-precision norm``, and the
    method's ``order``. The method's name, ``LowPrecision<norm_name>``, is also its torch surgery's."""

    norm_name: str
    nnx_type: type
    lp_type: type
    convert: Callable[[nnx.Module], nnx.Module]
    order: int = 0

    @property
    def method_name(self) -> str:
        return f"LowPrecision{self.norm_name}"


def apply_low_precision_norm(model: Any, precision: Any, norm: LowPrecisionNorm, *, inplace: bool, stacklevel: int):
    """The shared body of the two functional forms and methods: Composer's precision check, the NNX or torch surgery
    and its warnings."""
    if precision is not UNKNOWN_PRECISION and getattr(precision, "value", precision) not in LOW_PRECISIONS:
        warnings.warn(NoEffectWarning(f"Low Precision {norm.norm_name} only applies to AMP_FP16 and AMP_BF16 "
                                      f"precisions (got precision={precision!r})."), stacklevel=stacklevel)
        return model
    new, n = apply_surgery(norm.method_name, model,
                           lambda m: replace_norms(m, norm.nnx_type, norm.lp_type, norm.convert, inplace),
                           who=f"apply_low_precision_{norm.norm_name.lower()}")
    if n == 0:
        name = norm.norm_name
        warnings.warn(NoEffectWarning(f"No instances of {name} (nnx.{name} / torch.nn.{name}) found "
                                      f"in {type(model).__name__}."), stacklevel=stacklevel)
    return new


def low_precision_norm_method(norm: LowPrecisionNorm, apply_at: Any) -> Method:
    """Composer's ``LowPrecision<norm>(apply_at=Event.INIT)`` as a :class:`Method` (``model`` slot): the surgery
    in place, as Composer's."""
    check_apply_at(norm.method_name, apply_at)

    def model_fn(task, ctx):
        return task.with_model(apply_low_precision_norm(task.source, run_precision(ctx), norm, inplace=True,
                                                        stacklevel=4))

    return Method(name=norm.method_name, model=model_fn, order=norm.order,
                  description=f"{norm.method_name}(apply_at={apply_at!r})")


def canonical_axes(rank: int, axes: int | Sequence[int]) -> tuple[int, ...]:
    """``axes`` (one or several, negative counting from the end) as distinct non-negative axes of a rank-``rank``
    array, in flax's order (a set's)."""
    axes = (axes,) if isinstance(axes, int) else axes
    return tuple({rank + axis if axis < 0 else axis for axis in axes})


def norm_stats(x: jax.Array, axes: int | Sequence[int], dtype: Any, axis_name: str | None = None,
               axis_index_groups: Any = None, *, use_fast_variance: bool = True,
               mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``(mean, var)`` of real ``x`` over ``axes``, accumulated in ``dtype`` promoted to at least float32, over the
    positions ``mask`` selects; averaged over the devices of ``axis_name`` (its ``axis_index_groups``) in one
    ``pmean``. ``use_fast_variance`` takes ``E[x^2] - E[x]^2`` (clipped at zero: rounding can make it negative)."""
    dtype = jnp.promote_types(dtype, jnp.float32)
    x = jnp.asarray(x, dtype)
    axes = canonical_axes(x.ndim, axes)

    def mean(*arrays):
        means = tuple(a.mean(axes, where=mask) for a in arrays)
        if axis_name is None:
            return means
        # one collective for both statistics
        stacked = lax.pmean(jnp.stack(means, axis=0), axis_name, axis_index_groups=axis_index_groups)
        return tuple(stacked[i] for i in range(len(arrays)))

    if use_fast_variance:
        mu, mu2 = mean(x, lax.square(x))
        return mu, jnp.maximum(0.0, mu2 - lax.square(mu))
    (mu,) = mean(x)
    (var,) = mean(lax.square(x - jnp.expand_dims(mu, axes)))
    return mu, var


def normalize(x: jax.Array, mean: jax.Array, var: jax.Array, scale: jax.Array | None, bias: jax.Array | None,
              reduction_axes: int | Sequence[int], feature_axes: int | Sequence[int], dtype: Any,
              epsilon: float) -> jax.Array:
    """``(x - mean) * rsqrt(var + epsilon) * scale + bias`` in ``dtype``: ``mean`` and ``var`` have ``x``'s shape
    without ``reduction_axes``, ``scale`` and ``bias`` the shape of ``x``'s ``feature_axes``."""
    if not jnp.issubdtype(dtype, jnp.inexact):
        raise ValueError(f"Dtype must be inexact: {dtype}")
    reduction_axes = canonical_axes(x.ndim, reduction_axes)
    stats_shape = [1 if axis in reduction_axes else n for axis, n in enumerate(x.shape)]
    feature_axes = canonical_axes(x.ndim, feature_axes)
    feature_shape = [n if axis in feature_axes else 1 for axis, n in enumerate(x.shape)]
    y = x - mean.reshape(stats_shape)
    mul = lax.rsqrt(var.reshape(stats_shape) + epsilon)
    if scale is not None:
        mul = mul * scale.reshape(feature_shape)
    y = y * mul
    if bias is not None:
        y = y + bias.reshape(feature_shape)
    return jnp.asarray(y, dtype)
