"""Reductions and scans: sum/mean/prod, amax/amin, max/min (with indices), argmax/argmin, any/all, var/std,
cumsum/cumprod/logcumsumexp, logsumexp, vector norms.

Conventions carried over from torch: ``dim=None`` or ``dim=[]`` reduces over every dimension; integer and bool
inputs of sum/prod/cumsum/cumprod accumulate in int64 (int32 here, x64 being off); a ``dtype=`` argument casts the
input before reducing; half inputs accumulate in float32 and round once at the end; ``max.dim``/``min.dim`` send
the whole gradient to the returned index (torch's semantics), while ``amax``/``amin``/``max()`` split it evenly
among ties (JAX's and torch's semantics agree there); norms have a zero, not NaN, gradient at the zero vector.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from torch_bridge.ops.elementwise import dtype_category, maximum, minimum, opmath
from torch_bridge.ops.registry import lower, to_jnp_dtype

aten = torch.ops.aten

_BOOL = jnp.dtype(jnp.bool_)
_INT = jnp.dtype(jnp.int32)  # torch's int64, narrowed
_FLOAT = jnp.dtype(jnp.float32)


def _axes(x, dim):
    """torch's dim argument (int, list, None; [] means all) as a jnp ``axis``: None for all, else a tuple."""
    if dim is None:
        return None
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return None
    if x.ndim == 0:  # torch accepts dim 0 / -1 on a 0-dim tensor
        return ()
    return tuple(sorted(d % x.ndim for d in dims))


def _reduced_count(x, axes) -> int:
    if axes is None:
        return x.size
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _accumulating(x, dtype):
    """(input to reduce, result dtype) for sum/prod/cumsum/cumprod."""
    if dtype is not None:
        out = jnp.dtype(to_jnp_dtype(dtype))
        x = x.astype(out)
    elif dtype_category(x.dtype) < 2:
        out = _INT
        x = x.astype(out)
    else:
        out = x.dtype
    return x.astype(opmath(out)), out


# ----------------------------------------------------------------------------------------------------------------
# sum, mean, prod
# ----------------------------------------------------------------------------------------------------------------

@lower(aten.sum.dim_IntList)
def sum_dim(self, dim, keepdim=False, dtype=None):
    x, out = _accumulating(self, dtype)
    return jnp.sum(x, axis=_axes(self, dim), keepdims=keepdim).astype(out)


@lower(aten.sum.default)
def sum_all(self, dtype=None):
    return sum_dim(self, None, dtype=dtype)


@lower(aten.nansum.default)
def nansum(self, dim=None, keepdim=False, dtype=None):
    x, out = _accumulating(self, dtype)
    return jnp.nansum(x, axis=_axes(self, dim), keepdims=keepdim).astype(out)


@lower(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, dtype=None):
    x = self if dtype is None else self.astype(to_jnp_dtype(dtype))
    if dtype_category(x.dtype) < 2:
        raise TypeError(f"torch_bridge: mean of a {x.dtype} tensor needs a floating dtype= (as in torch)")
    return jnp.mean(x.astype(opmath(x.dtype)), axis=_axes(x, dim), keepdims=keepdim).astype(x.dtype)


@lower(aten.mean.default)
def mean_all(self, dtype=None):
    return mean_dim(self, None, dtype=dtype)


@lower(aten.prod.dim_int)
def prod_dim(self, dim, keepdim=False, dtype=None):
    x, out = _accumulating(self, dtype)
    return jnp.prod(x, axis=_axes(self, dim), keepdims=keepdim).astype(out)


@lower(aten.prod.default)
def prod_all(self, dtype=None):
    return prod_dim(self, None, dtype=dtype)


@lower(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_axes(self, dim), dtype=_INT)


# ----------------------------------------------------------------------------------------------------------------
# max / min family
# ----------------------------------------------------------------------------------------------------------------

@lower(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


@lower(aten.aminmax.default)
def aminmax(self, dim=None, keepdim=False):
    return amin(self, dim, keepdim), amax(self, dim, keepdim)


def _arg(fn, self, dim, keepdim):
    if dim is None:
        idx = fn(self.reshape(-1))
        if keepdim:
            idx = idx.reshape((1,) * self.ndim)
    elif self.ndim == 0:
        idx = jnp.zeros((), _INT)
    else:
        idx = fn(self, axis=dim % self.ndim, keepdims=keepdim)
    return idx.astype(_INT)


@lower(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    return _arg(jnp.argmax, self, dim, keepdim)


@lower(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    return _arg(jnp.argmin, self, dim, keepdim)


def _values_indices(fn, self, dim, keepdim):
    if self.ndim == 0:
        return self, jnp.zeros((), _INT)
    axis = dim % self.ndim
    idx = fn(self, axis=axis, keepdims=True).astype(_INT)
    values = jnp.take_along_axis(self, idx, axis=axis)  # gradient to the chosen index only, as torch
    if not keepdim:
        values, idx = jnp.squeeze(values, axis), jnp.squeeze(idx, axis)
    return values, idx


@lower(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    return _values_indices(jnp.argmax, self, dim, keepdim)


@lower(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    return _values_indices(jnp.argmin, self, dim, keepdim)


@lower(aten.max.default)
def max_all(self):
    return jnp.max(self)


@lower(aten.min.default)
def min_all(self):
    return jnp.min(self)


@lower(aten.max.other)
def max_other(self, other):
    return maximum(self, other)


@lower(aten.min.other)
def min_other(self, other):
    return minimum(self, other)


# ----------------------------------------------------------------------------------------------------------------
# any / all
# ----------------------------------------------------------------------------------------------------------------

def _logical_reduce(fn, self, dim, keepdim):
    out = fn(self != 0 if self.dtype != _BOOL else self, axis=_axes(self, dim), keepdims=keepdim)
    return out.astype(jnp.uint8) if self.dtype == jnp.uint8 else out  # torch keeps uint8 for uint8 input


@lower(aten.any.default)
def any_all(self):
    return _logical_reduce(jnp.any, self, None, False)


@lower(aten.any.dim, aten.any.dims)
def any_dim(self, dim=None, keepdim=False):
    return _logical_reduce(jnp.any, self, dim, keepdim)


@lower(aten.all.default)
def all_all(self):
    return _logical_reduce(jnp.all, self, None, False)


@lower(aten.all.dim, aten.all.dims)
def all_dim(self, dim=None, keepdim=False):
    return _logical_reduce(jnp.all, self, dim, keepdim)


# ----------------------------------------------------------------------------------------------------------------
# var / std
# ----------------------------------------------------------------------------------------------------------------

def _var_mean(self, dim, correction, keepdim):
    if dtype_category(self.dtype) < 2:
        raise TypeError(f"torch_bridge: var/std of a {self.dtype} tensor is not defined (as in torch)")
    correction = 1 if correction is None else correction
    axes = _axes(self, dim)
    x = self.astype(opmath(self.dtype))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    sq = jnp.sum(jnp.square(x - mean), axis=axes, keepdims=keepdim)
    var = sq / max(_reduced_count(self, axes) - correction, 0)
    if not keepdim:
        mean = jnp.squeeze(mean, axis=axes) if axes is not None else mean.reshape(())
    return var, mean


def _unbiased(unbiased):
    return 1 if unbiased else 0


@lower(aten.var.correction)
def var_correction(self, dim=None, correction=None, keepdim=False):
    return _var_mean(self, dim, correction, keepdim)[0].astype(self.dtype)


@lower(aten.var.dim)
def var_dim(self, dim, unbiased=True, keepdim=False):
    return var_correction(self, dim, correction=_unbiased(unbiased), keepdim=keepdim)


@lower(aten.var.default)
def var_all(self, unbiased=True):
    return var_correction(self, None, correction=_unbiased(unbiased))


@lower(aten.std.correction)
def std_correction(self, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(self, dim, correction, keepdim)[0]).astype(self.dtype)


@lower(aten.std.dim)
def std_dim(self, dim, unbiased=True, keepdim=False):
    return std_correction(self, dim, correction=_unbiased(unbiased), keepdim=keepdim)


@lower(aten.std.default)
def std_all(self, unbiased=True):
    return std_correction(self, None, correction=_unbiased(unbiased))


@lower(aten.var_mean.correction)
def var_mean_correction(self, dim=None, correction=None, keepdim=False):
    var, mean = _var_mean(self, dim, correction, keepdim)
    return var.astype(self.dtype), mean.astype(self.dtype)


@lower(aten.var_mean.dim)
def var_mean_dim(self, dim, unbiased=True, keepdim=False):
    return var_mean_correction(self, dim, correction=_unbiased(unbiased), keepdim=keepdim)


@lower(aten.std_mean.correction)
def std_mean_correction(self, dim=None, correction=None, keepdim=False):
    var, mean = _var_mean(self, dim, correction, keepdim)
    return jnp.sqrt(var).astype(self.dtype), mean.astype(self.dtype)


@lower(aten.std_mean.dim)
def std_mean_dim(self, dim, unbiased=True, keepdim=False):
    return std_mean_correction(self, dim, correction=_unbiased(unbiased), keepdim=keepdim)


# ----------------------------------------------------------------------------------------------------------------
# scans, logsumexp, norms
# ----------------------------------------------------------------------------------------------------------------

@lower(aten.cumsum.default)
def cumsum(self, dim, dtype=None):
    x, out = _accumulating(self, dtype)
    if self.ndim == 0:
        return x.astype(out)
    return jnp.cumsum(x, axis=dim % self.ndim).astype(out)


@lower(aten.cumprod.default)
def cumprod(self, dim, dtype=None):
    x, out = _accumulating(self, dtype)
    if self.ndim == 0:
        return x.astype(out)
    return jnp.cumprod(x, axis=dim % self.ndim).astype(out)


def _float_input(self):
    dtype = _FLOAT if dtype_category(self.dtype) < 2 else self.dtype
    return self.astype(opmath(dtype)), dtype


@lower(aten.logcumsumexp.default)
def logcumsumexp(self, dim):
    x, dtype = _float_input(self)
    if self.ndim == 0:
        return x.astype(dtype)
    return jax.lax.cumlogsumexp(x, axis=dim % self.ndim).astype(dtype)


@lower(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    x, dtype = _float_input(self)
    return jax.nn.logsumexp(x, axis=_axes(self, dim), keepdims=keepdim).astype(dtype)


def _vector_norm(self, ord, dim, keepdim, dtype):  # noqa: A002 - the ATen argument name
    if dtype is not None:
        self = self.astype(to_jnp_dtype(dtype))
    if dtype_category(self.dtype) < 2:
        raise TypeError(f"torch_bridge: norm of a {self.dtype} tensor is not defined (as in torch)")
    out_dtype = self.dtype
    x = jnp.abs(self.astype(opmath(out_dtype)))
    axes = _axes(self, dim)
    ord = float(ord)  # noqa: A001
    if ord == float("inf"):
        out = jnp.max(x, axis=axes, keepdims=keepdim)
    elif ord == float("-inf"):
        out = jnp.min(x, axis=axes, keepdims=keepdim)
    elif ord == 0:
        out = jnp.sum(x != 0, axis=axes, keepdims=keepdim).astype(x.dtype)
    elif ord == 1:
        out = jnp.sum(x, axis=axes, keepdims=keepdim)
    else:
        # sum(|x|^p)^(1/p), with torch's zero (not NaN) gradient where the norm is zero
        powered = jnp.sum(x * x if ord == 2 else x ** ord, axis=axes, keepdims=keepdim)
        zero = powered == 0
        safe = jnp.where(zero, 1, powered)
        root = jnp.sqrt(safe) if ord == 2 else safe ** (1 / ord)
        out = jnp.where(zero, 0, root)
    return out.astype(out_dtype)


@lower(aten.linalg_vector_norm.default)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):  # noqa: A002
    return _vector_norm(self, ord, dim, keepdim, dtype)


@lower(aten.norm.Scalar)
def norm_scalar(self, p=2):
    return _vector_norm(self, 2 if p is None else p, None, False, None)


@lower(aten.norm.ScalarOpt_dim)
def norm_dim(self, p, dim, keepdim=False):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim, None)


@lower(aten.norm.ScalarOpt_dim_dtype)
def norm_dim_dtype(self, p, dim, keepdim, dtype):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim, dtype)


@lower(aten.norm.ScalarOpt_dtype)
def norm_dtype(self, p, dtype):
    return _vector_norm(self, 2 if p is None else p, None, False, dtype)
