"""Max pooling whose gradient is a gather, not a scatter.

``lax.reduce_window(x, -inf, lax.max, ...)`` differentiates to ``select_and_scatter_add``, which XLA:GPU runs as
a forward that writes an index array per window position and a scatter with atomics: 1.9 ms of a 38 ms ResNet-50
step on an H200 (bs 256, its one 3x3/2 max-pool), more than any convolution. Here the forward is the max over the
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


def _lowest(dtype) -> np.ndarray:
    return np.array(-np.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min, dtype)


def _window_slices(x: jax.Array, dims) -> list[jax.Array]:
    """The padded input's strided slice for each window offset, in row-major window order."""
    window, strides, padding, dilation = dims
    xp = lax.pad(x, _lowest(x.dtype), [(lo, hi, 0) for lo, hi in padding])
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
    y = _max_pool(x, dims)
    return y, (x, y)


def _max_pool_backward(dims, residuals, dy):
    x, y = residuals
    slices, route = jax.vjp(lambda v: _window_slices(v, dims), x)  # route: per-slice gradients -> x's gradient
    taken = jnp.zeros(y.shape, bool)
    parts = []
    for s in slices:  # the first slice holding the max (NaN counts as equal to a NaN max) takes the gradient
        hit = ~taken & ((s == y) | (jnp.isnan(s) & jnp.isnan(y)))
        taken = taken | hit
        parts.append(jnp.where(hit, dy, jnp.zeros_like(dy)))
    return route(parts)


_max_pool.defvjp(_max_pool_forward, _max_pool_backward)
