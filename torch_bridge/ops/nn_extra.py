"""Weight norm, 3-D pooling, embedding bags and pairwise distances (imported by ``ops/nn.py``).

Lowers ``_weight_norm`` / ``_weight_norm_interface``; ``max_pool3d`` / ``max_pool3d_with_indices`` /
``avg_pool3d`` / ``adaptive_avg_pool3d`` / ``_adaptive_avg_pool3d`` / ``adaptive_max_pool3d`` (the 1-D/2-D helpers of
``nn_pool`` with ``nd=3``, plus a separable adaptive max); ``_embedding_bag`` / ``_embedding_bag_forward_only`` /
``embedding_bag`` (what ``torch.export`` keeps for ``nn.EmbeddingBag``: ``embedding_bag.padding_idx``); ``cdist`` /
``_cdist_forward`` / ``_euclidean_dist``.

Deliberate differences from torch:

* ``_weight_norm_interface`` accepts every ``dim`` (torch's fused kernel asserts ``dim`` is 0 or the last one),
  with ``_weight_norm``'s meaning: ``-1`` normalizes over the whole tensor (``weight_norm(dim=None)``), other
  negative dims wrap.
* ``embedding_bag``'s composite overloads return the auxiliary outputs of ``_embedding_bag_forward_only`` (what torch
  runs without autograd); with autograd torch runs ``_embedding_bag``, whose ``bag_size``/``max_indices`` in
  ``mode="sum"`` with ``include_last_offset`` have one entry fewer. Modules read only the first output.
* ``scale_grad_by_freq=True`` raises: torch's embedding-bag backward does not scale by a plain 1/count of each
  index in the batch (measured: an index seen once in a bag of three got 1/3), and values alone would hide a wrong
  gradient.
* ``cdist`` follows torch's choice of algorithm (``x1² + x2² - 2 x1·x2`` through one matmul when ``p == 2`` and
  ``compute_mode`` asks for it or either side has more than 25 rows, else the norm of the differences), so both
  paths carry torch's kind of rounding and memory profile. On the matmul path a distance between (nearly) equal
  points is cancellation error: torch may round it to 0 where this gives ~sqrt(eps)·|x| (1e-3 for |x| ~ 3), and
  then a large gradient where torch's is 0. Gradients are 0 wherever a distance (or, for ``p < 1`` and
  ``p = 1``/``inf``, a coordinate difference) is exactly 0, as torch's backward defines them, never NaN.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import torch

from jaxcomposer.models.pooling import lowest

from .nn_pool import adaptive_pool_matrix, argmax_pool_nd, avg_pool_nd, max_pool_nd, pool_tuple
from .registry import lower

A = torch.ops.aten


# --------------------------------------------------------------------------------------------- weight norm
def _norm_except_dim(v, dim):
    """torch's ``norm_except_dim(v, 2, dim)``: ``dim == -1`` is the whole tensor's norm, others wrap."""
    if dim == -1:
        return jnp.sqrt(jnp.sum(v * v)).reshape((1,) * v.ndim)
    dim %= v.ndim
    return jnp.sqrt(jnp.sum(v * v, axis=tuple(i for i in range(v.ndim) if i != dim), keepdims=True))


def _weight_norm_parts(v, g, dim):
    norm = _norm_except_dim(v, dim)
    if g.size == norm.size:  # torch's kernels read g flat: (out,) and (out, 1, 1) both work
        g = g.reshape(norm.shape)
    return v * (g / norm), norm


@lower(A._weight_norm.default)
def _weight_norm(v, g, dim=0):
    return _weight_norm_parts(v, g, dim)[0]


@lower(A._weight_norm_interface.default)
def _weight_norm_interface(v, g, dim=0):
    """(w, norm): the norm keeps ``v``'s rank with size 1 outside ``dim``, as torch's fused kernel returns it."""
    return _weight_norm_parts(v, g, dim)


# --------------------------------------------------------------------------------------------- 3-D pooling
def _max_pool3d(x, kernel_size, stride, padding, dilation, ceil_mode):
    """(values, indices). JAX has no VJP for a dilated max window, so dilated pools gather the values at torch's
    indices instead, which also sends the gradient where torch does (the first maximum)."""
    args = (kernel_size, stride, padding, dilation, ceil_mode)
    indices = argmax_pool_nd(x, 3, *args)
    if all(d == 1 for d in pool_tuple(dilation, 3)):
        return max_pool_nd(x, 3, *args), indices
    flat = x.reshape(x.shape[:-3] + (-1,))
    picked = jnp.take_along_axis(flat, indices.reshape(indices.shape[:-3] + (-1,)), axis=-1)
    return picked.reshape(indices.shape), indices


@lower(A.max_pool3d.default)
def max_pool3d(self, kernel_size, stride=(), padding=(0, 0, 0), dilation=(1, 1, 1), ceil_mode=False):
    if all(d == 1 for d in pool_tuple(dilation, 3)):
        return max_pool_nd(self, 3, kernel_size, stride, padding, dilation, ceil_mode)
    return _max_pool3d(self, kernel_size, stride, padding, dilation, ceil_mode)[0]


@lower(A.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=(0, 0, 0), dilation=(1, 1, 1), ceil_mode=False):
    return _max_pool3d(self, kernel_size, stride, padding, dilation, ceil_mode)


@lower(A.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=(0, 0, 0), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return avg_pool_nd(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lower(A.adaptive_avg_pool3d.default, A._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    sizes = self.shape[-3:]
    out = [s if o is None else o for s, o in zip(sizes, pool_tuple(output_size, 3))]
    if tuple(out) == (1, 1, 1):
        return self.mean((-3, -2, -1), keepdims=True)
    md, mh, mw = (jnp.asarray(adaptive_pool_matrix(n, o), self.dtype) for n, o in zip(sizes, out))
    return jnp.einsum("ad,...dhw,bh,cw->...abc", md, self, mh, mw)


@functools.partial(jax.jit, static_argnums=(1, 2))  # one XLA program when run eagerly, not ~50 dispatches
def _adaptive_max(x, nd, output_size):
    """Values and torch's flat in-plane indices of an adaptive max pool over the trailing ``nd`` dims.

    A max over a box is the max over each axis in turn, so each axis is reduced on its own: every bin sees the whole
    axis with the positions outside it masked (masks and one-hot selections rather than gathers or argmax, which
    XLA:CPU compiles slowly). Reducing the last axis first and taking the first maximum on each keeps torch's tie
    rule, the first maximum in row-major scan order; the values are selected at that position, so the gradient goes
    there alone.
    """
    out = [s if o is None else o for s, o in zip(x.shape[-nd:], output_size)]
    plane = x.shape[-nd:]
    vals = x
    flat = jnp.broadcast_to(jnp.arange(int(np.prod(plane)), dtype=jnp.int32).reshape(plane), x.shape)
    for axis in range(x.ndim - 1, x.ndim - 1 - nd, -1):
        size, o = x.shape[axis], out[axis - x.ndim + nd]
        lo = np.array([(i * size) // o for i in range(o)])[:, None]
        hi = np.array([-(-((i + 1) * size) // o) for i in range(o)])[:, None]
        lead = (1,) * (x.ndim - 1)  # explicit rank: the tests run with jax_numpy_rank_promotion="raise"
        span = np.arange(size).reshape(lead + (1, size))
        inside = (span >= lo) & (span < hi)  # (1, ..., o, size)

        def spread(a, axis=axis):  # (..., size) -> (..., o, size), the axis moved last
            return jnp.moveaxis(a, axis, -1)[..., None, :]

        masked = jnp.where(inside, spread(lax.stop_gradient(vals)), lowest(x.dtype))
        best = jnp.max(masked, axis=-1, keepdims=True)
        first = jnp.min(jnp.where(inside & (masked == best), span, size), axis=-1, keepdims=True)
        hot = span == first  # (..., o, size): one position per bin

        def select(a, axis=axis, hot=hot):
            return jnp.moveaxis(jnp.sum(jnp.where(hot, spread(a), 0), axis=-1).astype(a.dtype), -1, axis)

        vals, flat = select(vals), select(flat)
    return vals, flat


@lower(A.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max(self, 3, pool_tuple(output_size, 3))


# --------------------------------------------------------------------------------------------- embedding bag
_SUM, _MEAN, _MAX = 0, 1, 2


def _bags(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset,
          padding_idx, forward_only, op):
    """(output, offset2bag, bag_size, max_indices) as torch's CPU kernels return them.

    Every index belongs to the bag whose offset is the last one at or before it: as torch, indices past an
    ``include_last_offset`` end offset count in the last bag's size and max, and in its sum when a padding_idx is
    given (its sum stops at that offset without one).
    """
    if scale_grad_by_freq:
        raise NotImplementedError(f"torch_bridge: {op}(scale_grad_by_freq=True) is not lowered")
    if mode not in (_SUM, _MEAN, _MAX):
        raise NotImplementedError(f"torch_bridge: {op}(mode={mode}) is not lowered")
    if indices.ndim != 1:
        raise NotImplementedError(f"torch_bridge: {op} with {indices.ndim}-D indices is not lowered "
                                  "(F.embedding_bag flattens 2-D input before calling it)")
    if per_sample_weights is not None and mode != _SUM:
        raise NotImplementedError(f"torch_bridge: {op}(per_sample_weights=...) is only defined for mode='sum'")
    padding_idx = -1 if padding_idx is None else padding_idx
    n, dim = indices.shape[0], weight.shape[1]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    indices = indices.astype(jnp.int32)
    position = jnp.arange(n, dtype=jnp.int32)
    bag = (jnp.searchsorted(offsets[:bags].astype(jnp.int32), position, side="right") - 1).astype(jnp.int32)
    valid = indices != padding_idx  # never true for padding_idx < 0: indices are non-negative
    bag_size = jax.ops.segment_sum(valid.astype(jnp.int32), bag, bags)
    emb = jnp.take(weight, indices, axis=0)
    if mode == _MAX:
        masked = jnp.where(valid[:, None], emb, lowest(weight.dtype))
        best = jax.ops.segment_max(lax.stop_gradient(masked), bag, bags)
        first = jnp.where(valid[:, None] & (masked == best[bag]), position[:, None], n)
        first = jax.ops.segment_min(first, bag, bags)
        if n:
            max_indices = jnp.where(first < n, indices[jnp.minimum(first, n - 1)], 0)  # empty bags: 0, as torch
        else:
            max_indices = jnp.zeros((bags, dim), jnp.int32)
        # the output gathers the chosen weight entries, so the gradient reaches exactly those (torch's rule)
        out = weight[max_indices, jnp.arange(dim)[None, :]]
        out = jnp.where((bag_size > 0)[:, None], out, 0).astype(weight.dtype)
        return out, bag, bag_size, max_indices
    # torch's kernel without padding_idx stops a sum at the end offset; the one with it runs to the last index
    cut = include_last_offset and padding_idx < 0
    summed = valid & (position < offsets[bags]) if cut else valid
    terms = emb if per_sample_weights is None else emb * per_sample_weights[:, None].astype(emb.dtype)
    out = jax.ops.segment_sum(jnp.where(summed[:, None], terms, 0), bag, bags)
    if mode == _MEAN:
        out = (out / jnp.maximum(bag_size, 1)[:, None].astype(out.dtype)).astype(weight.dtype)
        return out, bag, bag_size, bag_size
    offset2bag = bag if padding_idx >= 0 else jnp.zeros((0,), jnp.int32)
    zeros = jnp.zeros((bags + (1 if forward_only and include_last_offset else 0),), jnp.int32)
    return out.astype(weight.dtype), offset2bag, zeros, zeros


@lower(A._embedding_bag.default)
def _embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _bags(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset,
                 padding_idx, False, "_embedding_bag")


@lower(A._embedding_bag_forward_only.default)
def _embedding_bag_forward_only(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                                per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    return _bags(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset,
                 padding_idx, True, "_embedding_bag_forward_only")


@lower(A.embedding_bag.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False):
    return _bags(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset,
                 -1, True, "embedding_bag")


@lower(A.embedding_bag.padding_idx)
def embedding_bag_padding_idx(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights,
                              include_last_offset, padding_idx):
    return _bags(weight, indices, offsets, scale_grad_by_freq, mode, per_sample_weights, include_last_offset,
                 padding_idx, True, "embedding_bag")


# --------------------------------------------------------------------------------------------- cdist
def _safe_root(s, root):
    """``s ** (1/root)`` with a zero gradient where ``s == 0`` (torch's backward masks those), never NaN."""
    pos = s > 0
    r = jnp.sqrt(jnp.where(pos, s, 1)) if root == 2 else jnp.where(pos, s, 1) ** (1.0 / root)
    return jnp.where(pos, r, 0)


def _euclid_mm(x1, x2):
    """torch's ``_euclidean_dist``: one matmul of [-2 x1, |x1|², 1] and [x2, 1, |x2|²], clamped at 0."""
    n1 = jnp.sum(x1 * x1, -1, keepdims=True)
    n2 = jnp.sum(x2 * x2, -1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], -1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], -1)
    s = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=lax.Precision.HIGHEST)
    return _safe_root(jnp.maximum(s, 0), 2)


@lower(A._euclidean_dist.default)
def _euclidean_dist(x1, x2):
    return _euclid_mm(x1, x2)


def _cdist(x1, x2, p, compute_mode, op):
    if x1.ndim < 2 or x2.ndim < 2 or x1.shape[-1] != x2.shape[-1]:
        raise ValueError(f"torch_bridge: {op} needs (..., P, M) and (..., R, M) inputs, got {x1.shape}, {x2.shape}")
    if p < 0:
        raise ValueError(f"torch_bridge: {op}(p={p}): p must be non-negative")
    if compute_mode not in (None, 0, 1, 2):
        raise NotImplementedError(f"torch_bridge: {op}(compute_mode={compute_mode}) is not lowered")
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:])
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:])
    if p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and max(x1.shape[-2], x2.shape[-2]) > 25)):
        return _euclid_mm(x1, x2)
    d = x1[..., :, None, :] - x2[..., None, :, :]
    a = jnp.where(d == 0, 0, jnp.abs(d))  # torch's backward uses sign(d), 0 at d == 0 (jax's |d|' is 1 there)
    if p == 0:
        return jnp.sum(lax.stop_gradient(d) != 0, -1).astype(x1.dtype)
    if p == 1:
        return jnp.sum(a, -1)
    if p == 2:
        return _safe_root(jnp.sum(d * d, -1), 2)
    if math.isinf(p):
        # torch's backward sends the full gradient to every coordinate reaching the max (jnp.max splits it)
        m = lax.stop_gradient(jnp.max(a, -1))
        at_max = lax.stop_gradient(a == m[..., None])
        return m + jnp.sum(jnp.where(at_max, a - lax.stop_gradient(a), 0), -1)
    nz = a > 0  # |d|**p has an infinite derivative at 0 for p < 1: torch's backward gives those 0
    powered = jnp.where(nz, jnp.where(nz, a, 1) ** p, 0)
    return _safe_root(jnp.sum(powered, -1), p)


@lower(A.cdist.default)
def cdist(x1, x2, p=2.0, compute_mode=None):
    return _cdist(x1, x2, p, compute_mode, "cdist")


@lower(A._cdist_forward.default)
def _cdist_forward(x1, x2, p, compute_mode):
    return _cdist(x1, x2, p, compute_mode, "_cdist_forward")


@lower(A._pdist_forward.default)
def _pdist_forward(self, p=2.0):
    """``F.pdist``: the distances of the row pairs ``i < j`` of an ``(N, M)`` input, row-major (torch's order),
    always by the direct difference (torch's pdist has no matmul path)."""
    if self.ndim != 2:
        raise ValueError(f"torch_bridge: _pdist_forward needs an (N, M) input, got shape {self.shape}")
    i, j = np.triu_indices(self.shape[0], k=1)
    return _cdist(self[i][:, None, :], self[j][:, None, :], p, 2, "_pdist_forward")[:, 0, 0]
