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


def _category(dtype) -> int:
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
    if _category(higher) >= 2:
        return higher if _category(higher) == 3 or _category(lower) < 3 else _promote(higher, lower)
    if higher == _BOOL or _category(lower) >= 2:
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
    return _DEFAULT_FLOAT if _category(dtype) < 2 else dtype


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
    """Wrap ``fn(a, b)`` with torch promotion. kind: default | int_to_float | bool_to_long | always_bool."""

    def run(a, b):
        a, b = same_rank(a, b)
        dtype = result_dtype(a, b)
        if kind == "int_to_float":
            dtype = int_to_float(dtype)
        elif kind == "bool_to_long" and dtype == _BOOL:
            dtype = _DEFAULT_INT
        compute = opmath(dtype)
        out = fn(_as(a, compute), _as(b, compute))
        return out if kind == "always_bool" else out.astype(dtype)

    return run


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
    self, other = same_rank(self, other)
    dtype = result_dtype(self, other)
    c = opmath(dtype)
    return (_as(self, c) + _scaled(_as(other, c), alpha)).astype(dtype)


@lower(aten.sub.Tensor, aten.sub.Scalar)
def sub(self, other, alpha=1):
    self, other = same_rank(self, other)
    dtype = result_dtype(self, other)
    c = opmath(dtype)
    return (_as(self, c) - _scaled(_as(other, c), alpha)).astype(dtype)


@lower(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(self, other, alpha=1):
    return sub(other, self, alpha=alpha)


_mul = _binary(jnp.multiply)


@lower(aten.mul.Tensor, aten.mul.Scalar)
def mul(self, other):
    return _mul(self, other)


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
    return jax.lax.div(a, b) if _category(a.dtype) < 2 else jnp.trunc(a / b)


def _div_floor(a, b):
    return jnp.floor_divide(a, b) if _category(a.dtype) < 2 else _div_floor_float(a, b)


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


@lower(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(self, other):
    return _floor_div(self, other)


def _remainder(a, b):
    mod = jnp.fmod(a, b)
    return jnp.where((mod != 0) & ((b < 0) != (mod < 0)), mod + b, mod)


_rem = _binary(_remainder)
_fmod = _binary(jnp.fmod)


@lower(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(self, other):
    return _rem(self, other)


@lower(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(self, other):
    return _fmod(self, other)


def _pow_scalar_exponent(base, exponent: float):
    if float(exponent).is_integer() and abs(exponent) <= 64:
        return jax.lax.integer_pow(base, int(exponent)) if exponent >= 0 or _category(base.dtype) >= 2 \
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


_max = _binary(jnp.maximum)
_min = _binary(jnp.minimum)
_fmax = _binary(jnp.fmax)
_fmin = _binary(jnp.fmin)
_atan2 = _binary(jnp.arctan2, "int_to_float")
_hypot = _binary(jnp.hypot, "int_to_float")
_copysign = _binary(jnp.copysign, "int_to_float")
_logaddexp = _binary(jnp.logaddexp, "int_to_float")


@lower(aten.maximum.default)
def maximum(self, other):
    return _max(self, other)


@lower(aten.minimum.default)
def minimum(self, other):
    return _min(self, other)


@lower(aten.fmax.default)
def fmax(self, other):
    return _fmax(self, other)


@lower(aten.fmin.default)
def fmin(self, other):
    return _fmin(self, other)


@lower(aten.atan2.default)
def atan2(self, other):
    return _atan2(self, other)


@lower(aten.hypot.default)
def hypot(self, other):
    return _hypot(self, other)


@lower(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(self, other):
    return _copysign(self, other)


@lower(aten.logaddexp.default)
def logaddexp(self, other):
    return _logaddexp(self, other)


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
    if _category(dtype) < 2:
        raise TypeError("torch_bridge: addcdiv does not support integer inputs (as in torch)")
    c = opmath(dtype)
    return (self.astype(c) + value * (tensor1.astype(c) / tensor2.astype(c))).astype(dtype)


# ----------------------------------------------------------------------------------------------------------------
# unary
# ----------------------------------------------------------------------------------------------------------------

def _register_unary_float(op, fn):
    run = _unary_float(fn)

    def lowering(self):
        return run(self)

    lowering.__name__ = op.__name__.split(".")[0]
    lower(op)(lowering)


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
    _register_unary_float(_op, _fn)


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
    return jnp.signbit(self) if _category(self.dtype) >= 2 else (self < 0) if self.dtype != _BOOL \
        else jnp.zeros_like(self)


def _rounding(fn):
    def run(self):
        return self if _category(self.dtype) < 2 else fn(self)

    return run


_ceil, _floor, _trunc, _round = (_rounding(f) for f in (jnp.ceil, jnp.floor, jnp.trunc, jnp.round))


@lower(aten.ceil.default)
def ceil(self):
    return _ceil(self)


@lower(aten.floor.default)
def floor(self):
    return _floor(self)


@lower(aten.trunc.default, aten.fix.default)
def trunc(self):
    return _trunc(self)


@lower(aten.round.default)
def round_(self):  # half to even, as torch
    return _round(self)


@lower(aten.round.decimals)
def round_decimals(self, decimals=0):
    if _category(self.dtype) < 2:
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
    if _category(self.dtype) < 2:
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


# ----------------------------------------------------------------------------------------------------------------
# predicates, comparisons, logical and bitwise ops
# ----------------------------------------------------------------------------------------------------------------

def _predicate(fn, int_value: bool):
    def run(self):
        if _category(self.dtype) < 2:
            return jnp.full(self.shape, int_value, _BOOL)
        return fn(self)

    return run


_isnan = _predicate(jnp.isnan, False)
_isinf = _predicate(jnp.isinf, False)
_isfinite = _predicate(jnp.isfinite, True)
_isposinf = _predicate(jnp.isposinf, False)
_isneginf = _predicate(jnp.isneginf, False)


@lower(aten.isnan.default)
def isnan(self):
    return _isnan(self)


@lower(aten.isinf.default)
def isinf(self):
    return _isinf(self)


@lower(aten.isfinite.default)
def isfinite(self):
    return _isfinite(self)


@lower(aten.isposinf.default)
def isposinf(self):
    return _isposinf(self)


@lower(aten.isneginf.default)
def isneginf(self):
    return _isneginf(self)


def _register_comparison(name, fn):
    run = _binary(fn, "always_bool")

    def lowering(self, other):
        return run(self, other)

    lowering.__name__ = name
    packet = getattr(aten, name)
    lower(packet.Tensor, packet.Scalar)(lowering)


for _name, _fn in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal),
                   ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    _register_comparison(_name, _fn)


def _truthy(x):
    if is_tensor(x):
        return x if x.dtype == _BOOL else x != 0
    return jnp.asarray(bool(x))


@lower(aten.logical_and.default)
def logical_and(self, other):
    self, other = same_rank(self, other)
    return jnp.logical_and(_truthy(self), _truthy(other))


@lower(aten.logical_or.default)
def logical_or(self, other):
    self, other = same_rank(self, other)
    return jnp.logical_or(_truthy(self), _truthy(other))


@lower(aten.logical_xor.default)
def logical_xor(self, other):
    self, other = same_rank(self, other)
    return jnp.logical_xor(_truthy(self), _truthy(other))


@lower(aten.logical_not.default)
def logical_not(self):
    return jnp.logical_not(_truthy(self))


def _bitwise(fn):
    def run(self, other):
        self, other = same_rank(self, other)
        dtype = result_dtype(self, other)
        if _category(dtype) >= 2:
            raise TypeError("torch_bridge: bitwise ops need integer or bool tensors (as in torch)")
        return fn(_as(self, dtype), _as(other, dtype))

    return run


_and, _or, _xor = _bitwise(jnp.bitwise_and), _bitwise(jnp.bitwise_or), _bitwise(jnp.bitwise_xor)


@lower(aten.bitwise_and.Tensor, aten.bitwise_and.Scalar, aten.__and__.Tensor, aten.__and__.Scalar)
def bitwise_and(self, other):
    return _and(self, other)


@lower(aten.bitwise_or.Tensor, aten.bitwise_or.Scalar, aten.__or__.Tensor, aten.__or__.Scalar)
def bitwise_or(self, other):
    return _or(self, other)


@lower(aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar, aten.__xor__.Tensor, aten.__xor__.Scalar)
def bitwise_xor(self, other):
    return _xor(self, other)


@lower(aten.bitwise_not.default)
def bitwise_not(self):
    if _category(self.dtype) >= 2:
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
