"""Max pooling whose gradient is a gather, not a scatter.

``lax.reduce_window(x, -inf, lax.max, ...)`` differentiates to ``select_and_scatter_add``, which XLA:GPU runs as
a forward that writes an index array per window position and a scatter with atomics: in a ResNet-50 step on a GPU
it cost more than any convolution (benchmarks/README.md, "GPU"). Here the forward is the max over the
window's strided slices of the padded input (one elementwise pass), and the backward routes each output gradient
to the first position of its window that holds the max, in row-major window order, as torch's max-pool does (its
indices point at the first maximum): each input position gathers from the windows that cover it, again one pass.
"""
from __future__ import annotations

import functools
import itertools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def max_pool(x: jax.Array, window: Sequence[int], strides: Sequence[int],
             padding: Sequence[tuple[int, int]], dilation: Sequence[int] | None = None) -> jax.Array:
    """``lax.reduce_window(x, lowest, lax.max, window, strides, padding, window_dilation=dilation)``, with a
    torch-like first-maximum gradient (see the module docstring). Every argument spans all of ``x``'s dims, as
    ``reduce_window``'s do; padding never wins (it is the dtype's lowest value)."""
    dims = (tuple(int(w) for w in window), tuple(int(s) for s in strides),
            tuple((int(lo), int(hi)) for lo, hi in padding),
            tuple(int(d) for d in dilation) if dilation is not None else (1,) * x.ndim)
    if any(len(spec) != x.ndim for spec in dims):
        raise ValueError(f"max_pool: window, strides, padding and dilation need one entry per dim of the "
                         f"{x.ndim}-d input, got {dims}.")
    return _max_pool(x, dims)


def lowest(dtype) -> np.ndarray:
    """The dtype's lowest value (-inf for floats) as a concrete numpy scalar: the max's identity, and the init
    value JAX recognizes (and differentiates) for max windows."""
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _window_slices(x: jax.Array, dims) -> list[jax.Array]:
    """The padded input's strided slice for each window offset, in row-major window order."""
    window, strides, padding, dilation = dims
    xp = lax.pad(x, lowest(x.dtype), [(lo, hi, 0) for lo, hi in padding])
    out = [(n - (w - 1) * d - 1) // s + 1 for n, w, d, s in zip(xp.shape, window, dilation, strides)]
    slices = []
    for offset in itertools.product(*(range(w) for w in window)):
        start = [o * d for o, d in zip(offset, dilation)]
        limit = [st + (m - 1) * s + 1 for st, m, s in zip(start, out, strides)]
        slices.append(lax.slice(xp, start, limit, strides))
    return slices


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x, dims):
    return functools.reduce(lax.max, _window_slices(x, dims))


def _max_pool_forward(x, dims):
    slices = _window_slices(x, dims)
    y = functools.reduce(lax.max, slices)
    # which window offset holds each output's first maximum (NaN matching a NaN max): one small integer per output
    # is the whole residual, so the backward reads neither the input nor the output again
    first = jnp.full(y.shape, len(slices), _offset_dtype(len(slices)))
    for k in reversed(range(len(slices))):
        s = slices[k]
        first = jnp.where((s == y) | (jnp.isnan(s) & jnp.isnan(y)), jnp.asarray(k, first.dtype), first)
    return y, (first, jax.ShapeDtypeStruct(x.shape, x.dtype))


def _max_pool_backward(dims, residuals, dy):
    first, x_type = residuals
    # the slicing's transpose (pads with interior zeros, summed) routes each offset's gradients back to the input;
    # it does not depend on the input's values, so zeros stand in for them and the compiler drops them
    _, route = jax.vjp(lambda v: _window_slices(v, dims), jnp.zeros(x_type.shape, x_type.dtype))
    zero = jnp.zeros_like(dy)
    return route([jnp.where(first == k, dy, zero) for k in range(int(np.prod(dims[0])))])


def _offset_dtype(count: int):
    return jnp.int8 if count < 127 else jnp.int32


_max_pool.defvjp(_max_pool_forward, _max_pool_backward)
