"""Elementwise ATen ops: arithmetic, comparisons, logical/bitwise ops, unary math, ``where``/``clamp``/``masked_fill``.

Result dtypes follow torch's type promotion, not JAX's: tensors with dimensions, zero-dim tensors and Python scalars
are three separate tiers (a zero-dim tensor or a scalar only moves the result to a higher *category*, bool < int <
float, never to a wider type of the same category), integer inputs of "int to float" ops give the default float, and
comparisons/logical ops give bool. As everywhere in torch_bridge, int64/float64 are held as int32/float32.
Half-precision inputs are computed in float32 and rounded once, as torch's CPU kernels do (its "opmath" type).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from torch_bridge.ops.registry import lower

aten = torch.ops.aten

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))
_DEFAULT_FLOAT = jnp.dtype(jnp.float32)
_DEFAULT_INT = jnp.dtype(jnp.int32)  # torch's int64, narrowed
_BOOL = jnp.dtype(jnp.bool_)


# ----------------------------------------------------------------------------------------------------------------
# torch type promotion
# ----------------------------------------------------------------------------------------------------------------

def is_tensor(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray))


def dtype_category(dtype) -> int:
    if dtype == _BOOL:
        return 0
    if jnp.issubdtype(dtype, jnp.integer):
        return 1
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return 3
    return 2


def _promote(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return jnp.dtype(jnp.promote_types(a, b))


def _combine(higher, lower):
    """c10's ``combine_categories``: ``lower`` only counts when it is of a higher category than ``higher``."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if dtype_category(higher) >= 2:
        return higher if dtype_category(higher) == 3 or dtype_category(lower) < 3 else _promote(higher, lower)
    if higher == _BOOL or dtype_category(lower) >= 2:
        return _promote(higher, lower)
    return higher


def scalar_dtype(x):
    if isinstance(x, bool):
        return _BOOL
    if isinstance(x, int):
        return _DEFAULT_INT
    if isinstance(x, float):
        return _DEFAULT_FLOAT
    if isinstance(x, complex):
        return jnp.dtype(jnp.complex64)
    raise TypeError(f"torch_bridge: not a tensor or a scalar: {x!r}")


def result_dtype(*args):
    """torch.result_type over any number of tensors (jax arrays) and Python scalars; ``None`` entries are skipped."""
    dim = zero = wrapped = None
    for x in args:
        if x is None:
            continue
        if is_tensor(x):
            if x.ndim:
                dim = _promote(dim, x.dtype)
            else:
                zero = _promote(zero, x.dtype)
        else:
            wrapped = _promote(wrapped, scalar_dtype(x))
    return _combine(dim, _combine(zero, wrapped))


def int_to_float(dtype):
    return _DEFAULT_FLOAT if dtype_category(dtype) < 2 else dtype


def opmath(dtype):
    return _DEFAULT_FLOAT if dtype in _HALF else dtype


def _as(x, dtype):
    """A tensor or Python scalar as a jax value of ``dtype``."""
    if is_tensor(x):
        return x if x.dtype == dtype else x.astype(dtype)
    return jnp.asarray(x, dtype=dtype)


def same_rank(*xs):
    """Give every tensor with dimensions the same rank (leading 1s), so torch's broadcasting works under
    ``jax_numpy_rank_promotion="raise"``; scalars, ``None`` and zero-dim tensors pass through."""
    rank = max((x.ndim for x in xs if is_tensor(x)), default=0)
    return tuple(x.reshape((1,) * (rank - x.ndim) + x.shape) if is_tensor(x) and 0 < x.ndim < rank else x
                 for x in xs)


def _binary(fn, kind="default"):
    """The one factory of binary lowerings: ``fn(a, b)`` with torch broadcasting and type promotion.

    kind: ``default`` (computed in ``opmath`` of the promoted dtype, cast back), ``int_to_float`` (ints/bools give
    float32), ``always_bool`` (comparisons: bool result), ``bitwise`` (promoted int/bool only, no opmath), ``logical``
    (both sides as truth values, bool result). The returned function takes ATen's argument names ``(self, other)``.
    """
    if kind not in ("default", "int_to_float", "always_bool", "bitwise", "logical"):
        raise ValueError(f"torch_bridge: unknown binary kind {kind!r}")

    def run(self, other):
        self, other = same_rank(self, other)
        if kind == "logical":
            return fn(_truthy(self), _truthy(other))
        dtype = result_dtype(self, other)
        if kind == "bitwise":
            if dtype_category(dtype) >= 2:
                raise TypeError("torch_bridge: bitwise ops need integer or bool tensors (as in torch)")
            return fn(_as(self, dtype), _as(other, dtype))
        if kind == "int_to_float":
            dtype = int_to_float(dtype)
        compute = opmath(dtype)
        out = fn(_as(self, compute), _as(other, compute))
        return out if kind == "always_bool" else out.astype(dtype)

    return run


def _define(name, ops, run):
    """Register ``run`` (made by a factory here) as the lowering of ``ops``, named ``name``, and return it."""
    run.__name__ = run.__qualname__ = name
    return lower(*ops)(run)


def _define_binary(name, ops, fn, kind="default"):
    return _define(name, ops, _binary(fn, kind))


def _unary_float(fn):
    """An "int to float" unary op: ints/bools give float32, halves compute in float32."""

    def run(self):
        dtype = int_to_float(self.dtype)
        return fn(self.astype(opmath(dtype))).astype(dtype)

    return run


# ----------------------------------------------------------------------------------------------------------------
# arithmetic
# ----------------------------------------------------------------------------------------------------------------

def _scaled(other, alpha):
    return other if alpha == 1 else other * alpha


@lower(aten.add.Tensor, aten.add.Scalar)
def add(self, other, alpha=1):
    return _binary(lambda a, b: a + _scaled(b, alpha))(self, other)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    return _binary(lambda a, b: a - _scaled(b, alpha))(self, other)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    return sub(other, self, alpha=alpha)


mul = _define_binary("mul", (aten.mul.Tensor, aten.mul.Scalar), jnp.multiply)


def _div_floor_float(a, b):
    """c10 ``div_floor_floating`` (Python's float floordiv)."""
    mod = jnp.fmod(a, b)
    div = (a - mod) / b
    div = jnp.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1, div)
    floordiv = jnp.floor(div)
    floordiv = jnp.where(div - floordiv > 0.5, floordiv + 1, floordiv)
    floordiv = jnp.where(div == 0, jnp.copysign(jnp.zeros_like(div), a / b), floordiv)
    return jnp.where(b == 0, a / b, floordiv)


def _div_trunc(a, b):
    return jax.lax.div(a, b) if dtype_category(a.dtype) < 2 else jnp.trunc(a / b)


def _div_floor(a, b):
    return jnp.floor_divide(a, b) if dtype_category(a.dtype) < 2 else _div_floor_float(a, b)


_true_div = _binary(jnp.true_divide, "int_to_float")
_trunc_div = _binary(_div_trunc)
_floor_div = _binary(_div_floor)


@lower(aten.div.Tensor, aten.div.Scalar)
def div(self, other):
    return _true_div(self, other)


@lower(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(self, other, rounding_mode=None):
    if rounding_mode is None:
        return _true_div(self, other)
    if rounding_mode == "trunc":
        return _trunc_div(self, other)
    if rounding_mode == "floor":
        return _floor_div(self, other)
    raise ValueError(f"torch_bridge: div rounding_mode must be None, 'trunc' or 'floor', not {rounding_mode!r}")


floor_divide = _define_binary("floor_divide", (aten.floor_divide.default, aten.floor_divide.Scalar), _div_floor)


def _remainder(a, b):
    mod = jnp.fmod(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


remainder = _define_binary("remainder", (aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor),
                           _remainder)
fmod = _define_binary("fmod", (aten.fmod.Tensor, aten.fmod.Scalar), jnp.fmod)


def _pow_scalar_exponent(base, exponent: float):
    if float(exponent).is_integer() and abs(exponent) <= 64:
        return jax.lax.integer_pow(base, int(exponent)) if exponent >= 0 or dtype_category(base.dtype) >= 2 \
            else jnp.power(base, int(exponent))
    if exponent == 0.5:
        return jnp.sqrt(base)
    if exponent == -0.5:
        return jax.lax.rsqrt(base)
    return jnp.power(base, jnp.asarray(exponent, base.dtype))


def _pow_dtype(*args):
    dtype = result_dtype(*args)
    return _DEFAULT_INT if dtype == _BOOL else dtype


@lower(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(self, exponent):
    dtype = _pow_dtype(self, exponent)
    return _pow_scalar_exponent(self.astype(opmath(dtype)), exponent).astype(dtype)


@lower(aten.pow.Tensor_Tensor)
def pow_tensor_tensor(self, exponent):
    self, exponent = same_rank(self, exponent)
    dtype = _pow_dtype(self, exponent)
    c = opmath(dtype)
    return jnp.power(self.astype(c), exponent.astype(c)).astype(dtype)


@lower(aten.pow.Scalar)
def pow_scalar(self, exponent):
    dtype = _pow_dtype(self, exponent)
    c = opmath(dtype)
    return jnp.power(jnp.asarray(self, c), exponent.astype(c)).astype(dtype)


@lower(aten.square.default)
def square(self):
    return pow_tensor_scalar(self, 2)


maximum = _define_binary("maximum", (aten.maximum.default,), jnp.maximum)
minimum = _define_binary("minimum", (aten.minimum.default,), jnp.minimum)
fmax = _define_binary("fmax", (aten.fmax.default,), jnp.fmax)
fmin = _define_binary("fmin", (aten.fmin.default,), jnp.fmin)
atan2 = _define_binary("atan2", (aten.atan2.default,), jnp.arctan2, "int_to_float")
hypot = _define_binary("hypot", (aten.hypot.default,), jnp.hypot, "int_to_float")
copysign = _define_binary("copysign", (aten.copysign.Tensor, aten.copysign.Scalar), jnp.copysign, "int_to_float")
logaddexp = _define_binary("logaddexp", (aten.logaddexp.default,), jnp.logaddexp, "int_to_float")


@lower(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(self, end, weight):
    self, end, weight = same_rank(self, end, weight)
    dtype = result_dtype(self, end, weight)
    c = opmath(dtype)
    a, b, w = _as(self, c), _as(end, c), _as(weight, c)
    diff = b - a
    return jnp.where(jnp.abs(w) < 0.5, a + w * diff, b - diff * (1 - w)).astype(dtype)


@lower(aten.addcmul.default)
def addcmul(self, tensor1, tensor2, value=1):
    self, tensor1, tensor2 = same_rank(self, tensor1, tensor2)
    dtype = result_dtype(self, tensor1, tensor2)
    c = opmath(dtype)
    return (self.astype(c) + value * (tensor1.astype(c) * tensor2.astype(c))).astype(dtype)


@lower(aten.addcdiv.default)
def addcdiv(self, tensor1, tensor2, value=1):
    self, tensor1, tensor2 = same_rank(self, tensor1, tensor2)
    dtype = result_dtype(self, tensor1, tensor2)
    if dtype_category(dtype) < 2:
        raise TypeError("torch_bridge: addcdiv does not support integer inputs (as in torch)")
    c = opmath(dtype)
    return (self.astype(c) + value * (tensor1.astype(c) / tensor2.astype(c))).astype(dtype)


# ----------------------------------------------------------------------------------------------------------------
# unary
# ----------------------------------------------------------------------------------------------------------------

for _op, _fn in [
    (aten.acos.default, jnp.arccos), (aten.acosh.default, jnp.arccosh), (aten.asin.default, jnp.arcsin),
    (aten.asinh.default, jnp.arcsinh), (aten.atan.default, jnp.arctan), (aten.atanh.default, jnp.arctanh),
    (aten.cos.default, jnp.cos), (aten.cosh.default, jnp.cosh), (aten.sin.default, jnp.sin),
    (aten.sinh.default, jnp.sinh), (aten.tan.default, jnp.tan),
    (aten.erf.default, jax.scipy.special.erf), (aten.erfc.default, jax.scipy.special.erfc),
    (aten.erfinv.default, jax.scipy.special.erfinv),
    (aten.exp.default, jnp.exp), (aten.exp2.default, jnp.exp2), (aten.expm1.default, jnp.expm1),
    (aten.log.default, jnp.log), (aten.log10.default, jnp.log10), (aten.log1p.default, jnp.log1p),
    (aten.log2.default, jnp.log2), (aten.sqrt.default, jnp.sqrt), (aten.rsqrt.default, jax.lax.rsqrt),
    (aten.reciprocal.default, jnp.reciprocal),
]:
    _define(_op.__name__.split(".")[0], (_op,), _unary_float(_fn))


@lower(aten.abs.default)
def abs_(self):
    if self.dtype == _BOOL:
        raise TypeError("torch_bridge: abs is not defined for bool tensors (as in torch)")
    return jnp.abs(self)


@lower(aten.neg.default)
def neg(self):
    if self.dtype == _BOOL:
        raise TypeError("torch_bridge: neg is not defined for bool tensors (use logical_not, as torch says)")
    return jnp.negative(self)


@lower(aten.positive.default)
def positive(self):
    return self


@lower(aten.sign.default, aten.sgn.default)
def sign(self):
    if self.dtype == _BOOL:
        return self
    return (self > 0).astype(self.dtype) - (self < 0).astype(self.dtype)  # torch: sign(nan) = 0, sign(-0.) = +0


@lower(aten.signbit.default)
def signbit(self):
    return jnp.signbit(self) if dtype_category(self.dtype) >= 2 else (self < 0) if self.dtype != _BOOL \
        else jnp.zeros_like(self)


def _rounding(fn):
    def run(self):
        return self if dtype_category(self.dtype) < 2 else fn(self)

    return run


ceil = _define("ceil", (aten.ceil.default,), _rounding(jnp.ceil))
floor = _define("floor", (aten.floor.default,), _rounding(jnp.floor))
trunc = _define("trunc", (aten.trunc.default, aten.fix.default), _rounding(jnp.trunc))
round_ = _define("round_", (aten.round.default,), _rounding(jnp.round))  # half to even, as torch


@lower(aten.round.decimals)
def round_decimals(self, decimals=0):
    if dtype_category(self.dtype) < 2:
        return self
    c = opmath(self.dtype)
    scale = jnp.asarray(10.0 ** abs(decimals), c)
    x = self.astype(c)
    out = jnp.round(x * scale) / scale if decimals >= 0 else jnp.round(x / scale) * scale
    return out.astype(self.dtype)


@lower(aten.frac.default)
def frac(self):
    return self - jnp.trunc(self)


@lower(aten.nan_to_num.default)
def nan_to_num(self, nan=None, posinf=None, neginf=None):
    if dtype_category(self.dtype) < 2:
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ----------------------------------------------------------------------------------------------------------------
# predicates, comparisons, logical and bitwise ops
# ----------------------------------------------------------------------------------------------------------------

def _predicate(fn, int_value: bool):
    def run(self):
        if dtype_category(self.dtype) < 2:
            return jnp.full(self.shape, int_value, _BOOL)
        return fn(self)

    return run


isnan = _define("isnan", (aten.isnan.default,), _predicate(jnp.isnan, False))
isinf = _define("isinf", (aten.isinf.default,), _predicate(jnp.isinf, False))
isfinite = _define("isfinite", (aten.isfinite.default,), _predicate(jnp.isfinite, True))
isposinf = _define("isposinf", (aten.isposinf.default,), _predicate(jnp.isposinf, False))
isneginf = _define("isneginf", (aten.isneginf.default,), _predicate(jnp.isneginf, False))

for _name, _fn in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal),
                   ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    _packet = getattr(aten, _name)
    _define_binary(_name, (_packet.Tensor, _packet.Scalar), _fn, "always_bool")


def _truthy(x):
    if is_tensor(x):
        return x if x.dtype == _BOOL else x != 0
    return jnp.asarray(bool(x))


logical_and = _define_binary("logical_and", (aten.logical_and.default,), jnp.logical_and, "logical")
logical_or = _define_binary("logical_or", (aten.logical_or.default,), jnp.logical_or, "logical")
logical_xor = _define_binary("logical_xor", (aten.logical_xor.default,), jnp.logical_xor, "logical")


@lower(aten.logical_not.default)
def logical_not(self):
    return jnp.logical_not(_truthy(self))


bitwise_and = _define_binary("bitwise_and", (aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.__and__.Tensor,
                                             aten.__and__.Scalar), jnp.bitwise_and, "bitwise")
bitwise_or = _define_binary("bitwise_or", (aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.__or__.Tensor,
                                           aten.__or__.Scalar), jnp.bitwise_or, "bitwise")
bitwise_xor = _define_binary("bitwise_xor", (aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.__xor__.Tensor,
                                             aten.__xor__.Scalar), jnp.bitwise_xor, "bitwise")


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    if dtype_category(self.dtype) >= 2:
        raise TypeError("torch_bridge: bitwise_not needs an integer or bool tensor (as in torch)")
    return jnp.invert(self)


# ----------------------------------------------------------------------------------------------------------------
# selection: where, clamp, masked_fill
# ----------------------------------------------------------------------------------------------------------------

@lower(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, self, other):
    condition, self, other = same_rank(condition, self, other)
    dtype = result_dtype(self, other)
    return jnp.where(_truthy(condition), _as(self, dtype), _as(other, dtype))


def _clamp(self, min, max):  # noqa: A002 - ATen argument names
    self, min, max = same_rank(self, min, max)  # noqa: A001
    dtype = result_dtype(self, min, max)
    out = _as(self, dtype)
    if min is not None:
        out = jnp.maximum(out, _as(min, dtype))
    if max is not None:
        out = jnp.minimum(out, _as(max, dtype))
    return out


@lower(aten.clamp.default, aten.clamp.Tensor, aten.clip.default, aten.clip.Tensor)
def clamp(self, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise ValueError("torch_bridge: clamp needs at least one of min and max (as in torch)")
    return _clamp(self, min, max)


@lower(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(self, min):  # noqa: A002
    return _clamp(self, min, None)


@lower(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(self, max):  # noqa: A002
    return _clamp(self, None, max)


@lower(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    self, mask = same_rank(self, mask)
    return jnp.where(_truthy(mask), _as(value, self.dtype), self)
