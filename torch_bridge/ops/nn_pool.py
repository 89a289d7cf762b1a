"""Pooling and padding ATen ops (imported by ``ops/nn.py``; split out only to keep files short).

Pooling windows cover the trailing ``nd`` dims, so batched (N, C, ...) and unbatched (C, ...) inputs both work.
``ceil_mode`` becomes extra right padding that never contributes (``-inf`` for max, excluded from the divisor for
avg), which is how torch defines it.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

import torch

from jaxcomposer.models.pooling import lowest as _lowest, max_pool

from .registry import lower

A = torch.ops.aten


def pool_tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    return v * n if len(v) == 1 else v


def _out_len(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:  # the last window must start inside the input or left pad
        out -= 1
    return out


def _window(x, nd, kernel, stride, padding, dilation, ceil_mode):
    """Window dims, strides, pads and dilations over the whole rank, with ceil_mode as extra right padding."""
    k, p, d = pool_tuple(kernel, nd), pool_tuple(padding, nd), pool_tuple(dilation, nd)
    s = pool_tuple(stride, nd) if stride else k
    pads = []
    for size, ki, si, pi, di in zip(x.shape[-nd:], k, s, p, d):
        out = _out_len(size, ki, si, pi, di, ceil_mode)
        pads.append((pi, max(0, (out - 1) * si + di * (ki - 1) + 1 - size - pi)))
    lead = x.ndim - nd
    return (1,) * lead + k, (1,) * lead + s, [(0, 0)] * lead + pads, (1,) * lead + d


def max_pool_nd(x, nd, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    win, strides, pads, dil = _window(x, nd, kernel, stride, padding, dilation, ceil_mode)
    return max_pool(x, win, strides, pads, dil)  # reduce_window's max, with a gradient that is no scatter


def argmax_pool_nd(x, nd, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """torch's indices: flat position inside each (spatial) plane of the first maximum in the window."""
    win, strides, pads, dil = _window(x, nd, kernel, stride, padding, dilation, ceil_mode)
    plane = x.shape[-nd:]
    idx = jnp.broadcast_to(jnp.arange(int(np.prod(plane)), dtype=jnp.int32).reshape(plane), x.shape)

    def pick(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = (vb > va) | ((vb == va) & (ib < ia)) | (jnp.isnan(vb) & ~jnp.isnan(va))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    init = (_lowest(x.dtype), np.array(np.iinfo(np.int32).max, np.int32))
    _, ind = lax.reduce_window((lax.stop_gradient(x), idx), init, pick, win, strides, pads, window_dilation=dil)
    return ind


@lower(A.max_pool1d.default)
def max_pool1d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_nd(x, 1, kernel_size, stride, padding, dilation, ceil_mode)


@lower(A.max_pool2d.default)
def max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return max_pool_nd(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lower(A.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """Values and torch-compatible int indices (computed only if a later node reads them; XLA drops them else)."""
    args = (kernel_size, stride, padding, dilation, ceil_mode)
    return max_pool_nd(x, 2, *args), argmax_pool_nd(x, 2, *args)


def avg_pool_divisor(spatial: tuple, dtype, win, strides, pads, count_include_pad):
    """The divisor of each output position (shape: the output's spatial dims), from the spatial window: ones over
    the input (and over the symmetric padding if ``count_include_pad``); the ceil_mode overhang never counts."""
    zero = np.array(0, dtype)
    p = [lo for lo, _ in pads]
    ones = jnp.ones(spatial, dtype)
    if count_include_pad:
        ones = jnp.pad(ones, [(pi, pi) for pi in p], constant_values=1)
        inner = [(0, hi - pi) for pi, (_, hi) in zip(p, pads)]
    else:
        inner = pads
    return lax.reduce_window(ones, zero, lax.add, win, strides, inner)


def avg_pool_nd(x, nd, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
    win, strides, pads, _ = _window(x, nd, kernel, stride, padding, 1, ceil_mode)
    total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, win, strides, pads)
    if divisor_override:
        return total / divisor_override
    count = avg_pool_divisor(x.shape[-nd:], x.dtype, win[-nd:], strides[-nd:], pads[-nd:], count_include_pad)
    return total / count.reshape((1,) * (x.ndim - nd) + count.shape)


@lower(A.avg_pool1d.default)
def avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return avg_pool_nd(x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@lower(A.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return avg_pool_nd(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def adaptive_pool_matrix(size, out):
    """(out, size) averaging matrix with torch's bins: [floor(i*size/out), ceil((i+1)*size/out))."""
    m = np.zeros((out, size), np.float32)
    for i in range(out):
        lo, hi = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, lo:hi] = 1.0 / (hi - lo)
    return m


@lower(A.adaptive_avg_pool2d.default, A._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    h, w = x.shape[-2:]
    oh, ow = [s if o is None else o for s, o in zip((h, w), pool_tuple(output_size, 2))]
    if (oh, ow) == (1, 1):
        return x.mean((-2, -1), keepdims=True)
    mh, mw = (jnp.asarray(adaptive_pool_matrix(n, o), x.dtype) for n, o in ((h, oh), (w, ow)))
    return jnp.einsum("oh,...hw,pw->...op", mh, x, mw)


@lower(A.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(x, output_size):
    (o,) = pool_tuple(output_size, 1)
    return jnp.einsum("ol,...l->...o", jnp.asarray(adaptive_pool_matrix(x.shape[-1], o), x.dtype), x)


# --------------------------------------------------------------------------------------------- padding
@lower(A.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    """torch's pad list runs from the last dim backwards, (lo, hi) each; negative entries crop (lax.pad does too)."""
    config = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        config[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), config)


_PAD_MODES = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


@lower(A.pad.default)
def pad(x, pad, mode="constant", value=None):
    if mode == "constant":
        return constant_pad_nd(x, pad, 0 if value is None else value)
    if mode not in _PAD_MODES or any(p < 0 for p in pad):
        raise NotImplementedError(f"torch_bridge: pad(mode={mode!r}) with pads {pad} is not lowered")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return jnp.pad(x, widths, mode=_PAD_MODES[mode])


def _register_pads(mode: str, packet: str):
    def padded(self, padding):  # the pad list's length (2 per padded dim) says how many trailing dims are padded
        return pad(self, padding, mode)

    lower(*(getattr(A, f"{packet}{nd}d").default for nd in (1, 2, 3)))(padded)


_register_pads("reflect", "reflection_pad")  # what F.pad(mode='reflect') dispatches to once decomposed
_register_pads("replicate", "replication_pad")
