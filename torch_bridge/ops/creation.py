"""Tensor-creation and random-number lowerings.

Dtype defaults follow torch: the default float dtype is float32, an int fill/range is int64 (held as int32, since
JAX runs with x64 off), ``*_like`` / ``new_*`` default to ``self``'s dtype. ``layout``, ``device``, ``pin_memory``
and ``memory_format`` are ignored: placement belongs to JAX.

``empty*`` ops return zeros: torch leaves the memory uninitialized, so any value is correct and zeros are
deterministic.

Random ops (``random=True``) get a fresh ``key`` from the caller, so a bridged model owns no RNG state. They draw
from the same *distribution* as torch, but torch's generator stream (``torch.manual_seed``) cannot be reproduced:
the same key gives the same values, and the values never equal torch's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from torch_bridge.ops.registry import lower, to_jnp_dtype

aten = __import__("torch").ops.aten

_FLOAT = jnp.float32  # torch.get_default_dtype()


def _scalar_dtype(value):
    """The dtype torch infers for a Python scalar (bool / int64 -> int32 / default float)."""
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jnp.int32
    if isinstance(value, float):
        return _FLOAT
    if hasattr(value, "dtype"):  # a jax scalar
        return value.dtype
    raise NotImplementedError(f"torch_bridge: no dtype for scalar {value!r} ({type(value).__name__})")


def _dtype(dtype, default):
    return default if dtype is None else to_jnp_dtype(dtype)


def _shape(size):
    return tuple(int(s) for s in size)


def _fill(shape, value, dtype):
    if jnp.issubdtype(dtype, jnp.integer) and isinstance(value, float) and np.isfinite(value):
        value = int(value)  # torch truncates toward zero
    return jnp.full(shape, value, dtype)


@lower(aten.full.default)
def full(size, fill_value, dtype=None, **_):
    return _fill(_shape(size), fill_value, _dtype(dtype, _scalar_dtype(fill_value)))


@lower(aten.full_like.default)
def full_like(self, fill_value, dtype=None, **_):
    return _fill(self.shape, fill_value, _dtype(dtype, self.dtype))


@lower(aten.new_full.default)
def new_full(self, size, fill_value, dtype=None, **_):
    return _fill(_shape(size), fill_value, _dtype(dtype, self.dtype))


@lower(aten.zeros.default, aten.empty.memory_format)
def zeros(size, dtype=None, **_):
    return jnp.zeros(_shape(size), _dtype(dtype, _FLOAT))


@lower(aten.empty_strided.default, aten.empty_permuted.default)
def empty_strided(size, stride=None, physical_layout=None, dtype=None, **_):
    return jnp.zeros(_shape(size), _dtype(dtype, _FLOAT))


@lower(aten.ones.default)
def ones(size, dtype=None, **_):
    return jnp.ones(_shape(size), _dtype(dtype, _FLOAT))


@lower(aten.zeros_like.default, aten.empty_like.default)
def zeros_like(self, dtype=None, **_):
    return jnp.zeros(self.shape, _dtype(dtype, self.dtype))


@lower(aten.ones_like.default)
def ones_like(self, dtype=None, **_):
    return jnp.ones(self.shape, _dtype(dtype, self.dtype))


@lower(aten.new_zeros.default, aten.new_empty.default)
def new_zeros(self, size, dtype=None, **_):
    return jnp.zeros(_shape(size), _dtype(dtype, self.dtype))


@lower(aten.new_empty_strided.default)
def new_empty_strided(self, size, stride, dtype=None, **_):
    return jnp.zeros(_shape(size), _dtype(dtype, self.dtype))


@lower(aten.new_ones.default)
def new_ones(self, size, dtype=None, **_):
    return jnp.ones(_shape(size), _dtype(dtype, self.dtype))


@lower(aten.zero.default)
def zero(self):
    return jnp.zeros_like(self)


@lower(aten.scalar_tensor.default)
def scalar_tensor(s, dtype=None, **_):
    return _fill((), s, _dtype(dtype, _FLOAT))


@lower(aten.fill.Scalar)
def fill_scalar(self, value):
    return _fill(self.shape, value, self.dtype)


@lower(aten.fill.Tensor)
def fill_tensor(self, value):
    return jnp.broadcast_to(value.astype(self.dtype), self.shape)


def _any_float(*values):
    return any(isinstance(v, float) for v in values)


@lower(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(start, end=None, step=1, dtype=None, **_):
    """A static range, computed in float64/int64 numpy as torch does, then held in the 32-bit dtype."""
    if end is None:
        start, end = 0, start
    start, end, step = (v.item() if hasattr(v, "item") else v for v in (start, end, step))
    target = _dtype(dtype, _FLOAT if _any_float(start, end, step) else jnp.int32)
    n = max(int(np.ceil((end - start) / step)), 0)
    if jnp.issubdtype(target, jnp.integer) and not _any_float(start, end, step):
        values = start + np.arange(n, dtype=np.int64) * step
    else:
        values = start + np.arange(n, dtype=np.float64) * step
    return jnp.asarray(values.astype(target))


@lower(aten.linspace.default, aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace(start, end, steps, dtype=None, **_):
    """torch's two-ended formula: the first half counts up from ``start``, the second half down from ``end``."""
    target = _dtype(dtype, _FLOAT)
    steps = int(steps)
    if steps == 1:
        return jnp.full((1,), start, target)
    i = np.arange(steps)
    work = jnp.float32
    start, end = jnp.asarray(start, work), jnp.asarray(end, work)
    step = (end - start) / (steps - 1)
    values = jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))
    return values.astype(target)


@lower(aten.eye.default, aten.eye.m)
def eye(n, m=None, dtype=None, **_):
    return jnp.eye(int(n), None if m is None else int(m), dtype=_dtype(dtype, _FLOAT))


def _tri_indices(fn, row, col, offset, dtype):
    r, c = fn(int(row), int(offset), int(col))
    return jnp.asarray(np.stack([r, c]).astype(_dtype(dtype, jnp.int32)))


@lower(aten.tril_indices.default)
def tril_indices(row, col, offset=0, dtype=None, **_):
    return _tri_indices(np.tril_indices, row, col, offset, dtype)


@lower(aten.triu_indices.default)
def triu_indices(row, col, offset=0, dtype=None, **_):
    return _tri_indices(np.triu_indices, row, col, offset, dtype)


@lower(aten._local_scalar_dense.default)
def local_scalar_dense(self):
    """``tensor.item()``: a Python scalar exists only when the value is concrete (not traced under jit)."""
    if isinstance(self, jax.core.Tracer):
        raise NotImplementedError(
            "torch_bridge: aten._local_scalar_dense (tensor.item(), int(t), float(t), bool(t)) needs the tensor's "
            "value as a Python scalar, which is data-dependent under jax.jit. Keep the value as a tensor, or compute "
            "it outside the bridged module")
    return np.asarray(self).item()


# -- random ------------------------------------------------------------------------------------------------------


def _uniform(key, shape, dtype, low=0.0, high=1.0):
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.random.uniform(key, shape, dtype, low, high)
    return jax.random.uniform(key, shape, _FLOAT, low, high).astype(dtype)


def _normal(key, shape, dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jax.random.normal(key, shape, dtype)
    return jax.random.normal(key, shape, _FLOAT).astype(dtype)


@lower(aten.rand.default, aten.rand.generator, random=True)
def rand(size, dtype=None, *, key, **_):
    return _uniform(key, _shape(size), _dtype(dtype, _FLOAT))


@lower(aten.randn.default, aten.randn.generator, random=True)
def randn(size, dtype=None, *, key, **_):
    return _normal(key, _shape(size), _dtype(dtype, _FLOAT))


@lower(aten.rand_like.default, aten.rand_like.generator, random=True)
def rand_like(self, dtype=None, *, key, **_):
    return _uniform(key, self.shape, _dtype(dtype, self.dtype))


@lower(aten.randn_like.default, aten.randn_like.generator, random=True)
def randn_like(self, dtype=None, *, key, **_):
    return _normal(key, self.shape, _dtype(dtype, self.dtype))


def _randint(key, shape, low, high, dtype):
    return jax.random.randint(key, shape, low, high, jnp.int32).astype(dtype)


@lower(aten.randint.default, aten.randint.generator, random=True)
def randint(high, size, dtype=None, *, key, **_):
    return _randint(key, _shape(size), 0, high, _dtype(dtype, jnp.int32))


@lower(aten.randint.low, aten.randint.low_generator, random=True)
def randint_low(low, high, size, dtype=None, *, key, **_):
    return _randint(key, _shape(size), low, high, _dtype(dtype, jnp.int32))


@lower(aten.randint_like.default, aten.randint_like.Tensor, aten.randint_like.generator,
       aten.randint_like.Tensor_generator, random=True)
def randint_like(self, high, dtype=None, *, key, **_):
    return _randint(key, self.shape, 0, high, _dtype(dtype, self.dtype))


@lower(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype, random=True)
def randint_like_low(self, low, high, dtype=None, *, key, **_):
    return _randint(key, self.shape, low, high, _dtype(dtype, self.dtype))


@lower(aten.randperm.default, aten.randperm.generator, random=True)
def randperm(n, dtype=None, *, key, **_):
    return jax.random.permutation(key, int(n)).astype(_dtype(dtype, jnp.int32))


@lower(aten.bernoulli.default, aten.bernoulli.Tensor, aten.bernoulli.p, random=True)
def bernoulli(self, p=None, *, key, **_):
    """``self`` holds the probabilities (``bernoulli.default``) or gives shape/dtype (``.p``/``.Tensor``)."""
    prob = self if p is None else jnp.broadcast_to(jnp.asarray(p, _FLOAT), self.shape)
    return jax.random.bernoulli(key, prob.astype(_FLOAT), self.shape).astype(self.dtype)


@lower(aten.uniform.default, random=True)
def uniform(self, *args, key, **kwargs):
    """Functional ``uniform_(from, to)`` (``from`` is a Python keyword, so it arrives through args/kwargs)."""
    low = args[0] if len(args) > 0 else kwargs.get("from", 0.0)
    high = args[1] if len(args) > 1 else kwargs.get("to", 1.0)
    return _uniform(key, self.shape, self.dtype, low, high)


@lower(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def normal(mean, std=1.0, *, key, **_):
    ref = [v for v in (mean, std) if hasattr(v, "shape")]
    shape = jnp.broadcast_shapes(*(v.shape for v in ref))
    dtype = jnp.result_type(*ref)
    mean, std = jnp.broadcast_to(mean, shape), jnp.broadcast_to(std, shape)  # explicit: rank promotion may raise
    return (mean + std * _normal(key, shape, dtype)).astype(dtype)


@lower(aten.normal.float_float, random=True)
def normal_float(mean, std, size, dtype=None, *, key, **_):
    target = _dtype(dtype, _FLOAT)
    return (mean + std * _normal(key, _shape(size), target)).astype(target)
