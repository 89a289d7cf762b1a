"""Resampling ATen ops (imported by ``ops/nn.py``): ``nn.Upsample`` / ``F.interpolate``, ``F.grid_sample`` with
``F.affine_grid``, and ``F.unfold`` / ``F.fold``.

- ``upsample_*`` / ``_upsample_*_aa`` (``.vec``, which is what ``torch.export`` emits, and ``.default``): separable,
  one axis at a time. Source indices and weights are computed at trace time (shapes are static) with torch's CPU
  formulas in float32, including linear's shortcut (a copy when out == in, even if a scale factor other than 1
  was given), so indices match torch exactly.
  Nearest / linear / cubic gather their 1/2/4 taps per axis; antialiased modes (whose support grows with the
  downsampling factor) multiply by a dense (out, in) weight matrix.
- ``grid_sampler`` / ``grid_sampler_2d`` / ``grid_sampler_3d``: bilinear (trilinear in 3-D), nearest (round half
  to even, as ``nearbyint``) and 2-D bicubic, zeros/border/reflection padding. Clipping and reflection are written
  so autodiff reproduces torch's hand-written grid gradient (a clipped coordinate has zero gradient, borders
  included).
- ``im2col`` / ``col2im``: one strided slice (resp. interior-padded add) per kernel tap.
"""
from __future__ import annotations

import functools
import itertools
import operator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import torch

from .registry import lower

A = torch.ops.aten
_F32 = np.float32


# --------------------------------------------------------------------------------------------- upsampling
def _vec_args(x, nd, output_size, scale_factors, op):
    """(output sizes, per-axis scales or None) of a ``.vec`` overload, as torch's ``compute_output_size``."""
    if (output_size is None) == (scale_factors is None):
        raise ValueError(f"torch_bridge: {op}: give exactly one of output_size and scale_factors")
    if output_size is not None:
        return [int(s) for s in output_size], [None] * nd
    scales = list(scale_factors)
    if len(scales) != nd:
        raise ValueError(f"torch_bridge: {op}: expected {nd} scale factors, got {scales}")
    return [int(n * s) for n, s in zip(x.shape[-nd:], scales)], scales


def _scale(in_size, out_size, scale):
    """torch's ``compute_scales_value<float>``: 1/scale when a positive scale factor was given, else in/out."""
    if scale is not None and scale > 0:
        return _F32(1.0 / scale)
    return _F32(in_size) / _F32(out_size)


def _area_scale(in_size, out_size, align_corners, scale):
    if align_corners:
        return _F32(in_size - 1) / _F32(out_size - 1) if out_size > 1 else _F32(0)
    return _scale(in_size, out_size, scale)


def _source_index(scale, out_size, align_corners, cubic):
    """torch's ``area_pixel_compute_source_index`` in float32; negative indices clamp to 0 except for cubic."""
    i = np.arange(out_size, dtype=_F32)
    if align_corners:
        return scale * i
    src = scale * (i + _F32(0.5)) - _F32(0.5)
    return src if cubic else np.maximum(src, _F32(0))


def _nearest_index(in_size, out_size, scale, exact):
    i = np.arange(out_size)
    s = _scale(in_size, out_size, scale)
    if exact:  # (i + 0.5) is a double in torch; the product is rounded to float before floorf
        src = np.floor(((i + 0.5) * np.float64(s)).astype(_F32))
    else:
        src = np.floor(i.astype(_F32) * s)
    return np.minimum(src.astype(np.int64), in_size - 1)[:, None]


def _linear_taps(in_size, out_size, align_corners, scale):
    if out_size == in_size:
        return np.arange(out_size)[:, None], np.ones((out_size, 1), _F32)
    real = _source_index(_area_scale(in_size, out_size, align_corners, scale), out_size, align_corners, False)
    i0 = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    lam1 = np.clip(real - i0.astype(_F32), _F32(0), _F32(1))
    i1 = np.where(i0 < in_size - 1, i0 + 1, i0)
    return np.stack([i0, i1], 1), np.stack([_F32(1) - lam1, lam1], 1)


def _cubic_weights(t, a):
    """Cubic convolution weights of the taps at offsets -1, 0, 1, 2 for fractional position ``t``."""
    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _cubic_taps(in_size, out_size, align_corners, scale):
    real = _source_index(_area_scale(in_size, out_size, align_corners, scale), out_size, align_corners, True)
    i0 = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    t = np.clip(real - i0.astype(_F32), _F32(0), _F32(1))
    idx = np.clip(i0[:, None] + np.arange(-1, 3), 0, in_size - 1)  # border taps repeat the edge pixel
    return idx, np.stack(_cubic_weights(t, _F32(-0.75)), 1).astype(_F32)


def _aa_matrix(in_size, out_size, align_corners, scale, cubic):
    """(out, in) weights of torch's antialiased resize (PIL's): a triangle (or Keys cubic with a = -0.5) filter
    stretched by the downsampling factor, normalized over the taps that fall inside the input."""
    interp = 4 if cubic else 2
    s = _area_scale(in_size, out_size, align_corners, scale)
    support = _F32(interp * 0.5) * s if s >= 1 else _F32(interp * 0.5)
    max_taps = int(np.ceil(support)) * 2 + 1
    inv = _F32(1) / s if s >= 1 else _F32(1)
    m = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = s * _F32(i + 0.5)
        lo = max(int(center - support + _F32(0.5)), 0)
        size = min(max(min(int(center + support + _F32(0.5)), in_size) - lo, 0), max_taps)
        x = np.abs((np.arange(lo, lo + size, dtype=np.float64) - center + 0.5) * inv)
        if cubic:
            a = -0.5
            w = np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                         np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))
        else:
            w = np.maximum(1 - x, 0.0)
        total = w.sum()
        m[i, lo:lo + size] = w / total if total != 0 else w
    return m.astype(_F32)


def _gather_axis(x, axis, idx, w):
    """``sum_k x[..., idx[:, k], ...] * w[:, k]`` along ``axis``; ``w`` None for nearest (one tap). One gather of
    all taps (one scatter in the gradient), not one per tap."""
    out_size, k = idx.shape
    g = jnp.take(x, jnp.asarray(idx.reshape(-1), jnp.int32), axis=axis, mode="clip")
    if w is None:
        return g
    g = g.reshape(*x.shape[:axis], out_size, k, *x.shape[axis + 1:])
    shape = [1] * g.ndim
    shape[axis:axis + 2] = [out_size, k]
    return jnp.sum(g * jnp.asarray(w, x.dtype).reshape(shape), axis=axis + 1)


def _floating(x, op):
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise NotImplementedError(f"torch_bridge: {op} on dtype {x.dtype} (only floating inputs are lowered)")


def _nearest(x, out_sizes, scales, exact):
    nd = len(out_sizes)
    for d, (o, s) in enumerate(zip(out_sizes, scales)):
        axis = x.ndim - nd + d
        x = _gather_axis(x, axis, _nearest_index(x.shape[axis], o, s, exact).reshape(-1, 1), None)
    return x


def _interp(x, out_sizes, align_corners, scales, mode, op):
    _floating(x, op)
    nd = len(out_sizes)
    for d, (o, s) in enumerate(zip(out_sizes, scales)):
        axis = x.ndim - nd + d
        n = x.shape[axis]
        if mode in ("linear", "cubic"):
            taps = (_linear_taps if mode == "linear" else _cubic_taps)(n, o, align_corners, s)
            x = _gather_axis(x, axis, *taps)
        else:
            m = jnp.asarray(_aa_matrix(n, o, align_corners, s, mode == "cubic_aa"), x.dtype)
            x = jnp.moveaxis(jnp.tensordot(x, m, axes=((axis,), (1,)), precision=lax.Precision.HIGHEST), -1, axis)
    return x


def _register_nearest(nd, exact):
    name = f"_upsample_nearest_exact{nd}d" if exact else f"upsample_nearest{nd}d"
    packet = getattr(A, name)

    @lower(packet.vec)
    def vec(input, output_size, scale_factors):
        sizes, scales = _vec_args(input, nd, output_size, scale_factors, name)
        return _nearest(input, sizes, scales, exact)

    if nd == 1:
        @lower(packet.default)
        def default(self, output_size, scales=None):
            return _nearest(self, list(output_size), [scales], exact)
    elif nd == 2:
        @lower(packet.default)
        def default(self, output_size, scales_h=None, scales_w=None):
            return _nearest(self, list(output_size), [scales_h, scales_w], exact)
    else:
        @lower(packet.default)
        def default(self, output_size, scales_d=None, scales_h=None, scales_w=None):
            return _nearest(self, list(output_size), [scales_d, scales_h, scales_w], exact)


def _register_interp(name, nd, mode):
    packet = getattr(A, name)

    @lower(packet.vec)
    def vec(input, output_size, align_corners, scale_factors):
        sizes, scales = _vec_args(input, nd, output_size, scale_factors, name)
        return _interp(input, sizes, align_corners, scales, mode, name)

    if nd == 1:
        @lower(packet.default)
        def default(self, output_size, align_corners, scales=None):
            return _interp(self, list(output_size), align_corners, [scales], mode, name)
    elif nd == 2:
        @lower(packet.default)
        def default(self, output_size, align_corners, scales_h=None, scales_w=None):
            return _interp(self, list(output_size), align_corners, [scales_h, scales_w], mode, name)
    else:
        @lower(packet.default)
        def default(self, output_size, align_corners, scales_d=None, scales_h=None, scales_w=None):
            return _interp(self, list(output_size), align_corners, [scales_d, scales_h, scales_w], mode, name)


for _nd in (1, 2, 3):
    _register_nearest(_nd, exact=False)
    _register_nearest(_nd, exact=True)
_register_interp("upsample_linear1d", 1, "linear")
_register_interp("upsample_bilinear2d", 2, "linear")
_register_interp("upsample_trilinear3d", 3, "linear")
_register_interp("upsample_bicubic2d", 2, "cubic")
_register_interp("_upsample_bilinear2d_aa", 2, "linear_aa")
_register_interp("_upsample_bicubic2d_aa", 2, "cubic_aa")


# --------------------------------------------------------------------------------------------- grid sampling
_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


def _clip(c, size):
    # where, not jnp.clip: torch's gradient is 0 at the borders too (jnp.clip's is 0.5 at a tie)
    return jnp.where(c <= 0, jnp.zeros_like(c), jnp.where(c >= size - 1, jnp.full_like(c, size - 1), c))


def _reflect(c, twice_low, twice_high):
    if twice_low == twice_high:
        return jnp.zeros_like(c)
    lo, span = twice_low / 2, (twice_high - twice_low) / 2
    c = c - lo
    c = jnp.where(c < 0, -c, c)  # torch's gradient sign: +1 at exactly 0
    extra = jnp.fmod(c, span)
    flips = jnp.floor(lax.stop_gradient(c) / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)


def _pad_coords(c, size, padding, align_corners):
    if padding == 1:
        return _clip(c, size)
    if padding == 2:
        c = _reflect(c, 0, 2 * (size - 1)) if align_corners else _reflect(c, -1, 2 * size - 1)
        return _clip(c, size)
    return c


def _unnormalize(g, size, align_corners):
    if align_corners:
        return (g + 1) / 2 * (size - 1)
    return ((g + 1) * size - 1) / 2


def _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners, nd, op):
    _floating(x, op)
    if interpolation_mode not in _MODES or padding_mode not in _PADDINGS:
        raise NotImplementedError(f"torch_bridge: {op}: interpolation_mode={interpolation_mode}, "
                                  f"padding_mode={padding_mode}")
    if interpolation_mode == 2 and nd != 2:
        raise NotImplementedError(f"torch_bridge: {op}: bicubic interpolation is 2-D only (as in torch)")
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    out_shape = grid.shape[1:-1]
    flat = x.reshape(n, c, -1)
    strides = [int(np.prod(sizes[d + 1:])) for d in range(nd)]
    # grid's last axis is (x, y[, z]): the reverse of the spatial axes
    coords = [_unnormalize(grid[..., nd - 1 - d], sizes[d], align_corners) for d in range(nd)]

    def read(taps):
        """sum over taps of x at integer coordinates (per spatial axis, float) times weight; out of range -> 0.
        All taps in one gather (one scatter-add in the gradient)."""
        idx = [jnp.stack([t[0][d] for t in taps], 1) for d in range(nd)]  # (N, taps, *out)
        w = jnp.stack([t[1] for t in taps], 1)
        inside = functools.reduce(operator.and_, [(i >= 0) & (i <= s - 1) for i, s in zip(idx, sizes)])
        flat_idx = sum(jnp.clip(i, 0, s - 1).astype(jnp.int32) * st for i, s, st in zip(idx, sizes, strides))
        vals = jax.vmap(lambda f, j: f[:, j])(flat, flat_idx.reshape(n, -1)).reshape(n, c, len(taps), *out_shape)
        w = jnp.where(inside, w, jnp.zeros_like(w))[:, None]
        return jnp.sum(vals * w, axis=2)

    if interpolation_mode == 1:
        idx = [jnp.round(_pad_coords(co, s, padding_mode, align_corners)) for co, s in zip(coords, sizes)]
        return read([(lax.stop_gradient(idx), jnp.ones(idx[0].shape, x.dtype))])
    if interpolation_mode == 0:
        pos = [_pad_coords(co, s, padding_mode, align_corners) for co, s in zip(coords, sizes)]
        base = [lax.stop_gradient(jnp.floor(p)) for p in pos]
        frac = [p - b for p, b in zip(pos, base)]
        taps = []
        for corner in itertools.product((0, 1), repeat=nd):
            w = functools.reduce(operator.mul, [f if k else 1 - f for f, k in zip(frac, corner)])
            taps.append(([b + k for b, k in zip(base, corner)], w))
        return read(taps)
    # bicubic: padding applies to each tap's integer coordinate, not to the sampling point
    base = [lax.stop_gradient(jnp.floor(co)) for co in coords]
    weights = [_cubic_weights(co - b, -0.75) for co, b in zip(coords, base)]
    taps = []
    for ky, kx in itertools.product(range(4), repeat=2):
        idx = [_pad_coords(base[0] + (ky - 1), sizes[0], padding_mode, align_corners),
               _pad_coords(base[1] + (kx - 1), sizes[1], padding_mode, align_corners)]
        taps.append(([lax.stop_gradient(i) for i in idx], weights[0][ky] * weights[1][kx]))
    return read(taps)


@lower(A.grid_sampler.default)
def grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners):
    nd = input.ndim - 2
    if nd not in (2, 3):
        raise NotImplementedError(f"torch_bridge: aten.grid_sampler on a {input.ndim}-D input (4-D or 5-D only)")
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, nd, "aten.grid_sampler")


@lower(A.grid_sampler_2d.default)
def grid_sampler_2d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, 2, "aten.grid_sampler_2d")


@lower(A.grid_sampler_3d.default)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners, 3, "aten.grid_sampler_3d")


@lower(A.affine_grid_generator.default)
def affine_grid_generator(theta, size, align_corners):
    """(N, *spatial, nd) sampling grid: the affine map ``theta`` (N, nd, nd + 1) applied to the (x, y[, z], 1)
    coordinates of every output point, in [-1, 1] (pixel centres unless align_corners)."""
    spatial = [int(s) for s in size[2:]]
    if len(spatial) not in (2, 3):
        raise NotImplementedError(f"torch_bridge: aten.affine_grid_generator with size {list(size)} (4-D or 5-D)")

    def line(n):
        a = 1.0 if align_corners else (n - 1) / n
        return np.linspace(-a, a, n) if n > 1 else np.zeros(1)  # torch: a single step sits at 0 either way

    axes = np.meshgrid(*[line(n) for n in spatial], indexing="ij")
    base = np.stack([*axes[::-1], np.ones(spatial)], -1).astype(_F32)  # (..., x, y[, z], 1)
    grid = jnp.einsum("...k,njk->n...j", jnp.asarray(base, theta.dtype), theta, precision=lax.Precision.HIGHEST)
    return grid


# --------------------------------------------------------------------------------------------- unfold / fold
def _blocks(size, k, d, p, s):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@lower(A.im2col.default)
def im2col(self, kernel_size, dilation, padding, stride):
    """(N, C*kh*kw, L) sliding blocks, channel-major then kernel row then column, as torch's ``F.unfold``."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    x = self
    lead, (h, w) = x.shape[:-2], x.shape[-2:]
    oh, ow = _blocks(h, kh, dh, ph, sh), _blocks(w, kw, dw, pw, sw)
    x = jnp.pad(x, [(0, 0)] * len(lead) + [(ph, ph), (pw, pw)])
    taps = [x[..., i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    cols = jnp.stack(taps, -3)  # (..., C, kh*kw, oh, ow)
    return cols.reshape(*lead[:-1], lead[-1] * kh * kw, oh * ow)


@lower(A.col2im.default)
def col2im(self, output_size, kernel_size, dilation, padding, stride):
    """The adjoint of im2col: every block's values added back at their positions (overlaps sum)."""
    (h, w), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = output_size, kernel_size, dilation, padding, stride
    oh, ow = _blocks(h, kh, dh, ph, sh), _blocks(w, kw, dw, pw, sw)
    lead = self.shape[:-2]
    cols = self.reshape(*lead, self.shape[-2] // (kh * kw), kh, kw, oh, ow)
    hp, wp = h + 2 * ph, w + 2 * pw
    zero = jnp.zeros((), self.dtype)
    out = None
    for i in range(kh):
        for j in range(kw):
            # tap (i, j) of block (a, b) lands at (i*dh + a*sh, j*dw + b*sw) of the padded output
            cfg = [(0, 0, 0)] * (cols.ndim - 4) + [
                (i * dh, hp - i * dh - sh * (oh - 1) - 1, sh - 1), (j * dw, wp - j * dw - sw * (ow - 1) - 1, sw - 1)]
            placed = lax.pad(cols[..., i, j, :, :], zero, cfg)
            out = placed if out is None else out + placed
    return out[..., ph:ph + h, pw:pw + w]
