"""Shape, view, layout and dtype-conversion lowerings.

Views become copies: JAX arrays are immutable, and a functionalized export graph never writes through a view, so a
view and a copy are indistinguishable here. Arrays are taken to be contiguous row-major (what ``as_strided``,
``sym_stride`` and ``sym_storage_offset`` report and assume). Sizes, dims and slice bounds are static Python ints.
"""
from __future__ import annotations

import math
import sys

import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_bridge.ops.registry import lower, to_jnp_dtype

aten = __import__("torch").ops.aten


def wrap_dim(dim: int, ndim: int) -> int:
    """Torch dim wrapping: ``dim`` in ``[-ndim, ndim)``; a 0-d tensor accepts -1 and 0."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"torch_bridge: dim {dim} out of range for a {ndim}-d tensor")
    return dim % n


def norm_slice(size: int, start, end, step=1) -> tuple[int, int, int]:
    """Torch ``slice`` bounds: None means the ends, negatives wrap once, then clip into ``[0, size]``."""
    start = 0 if start is None else int(start)
    end = size if end is None or end >= sys.maxsize else int(end)
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    if int(step) <= 0:
        raise ValueError("torch_bridge: slice step must be positive")
    return start, end, int(step)


def _slice(x, dim, start, end, step):
    dim = wrap_dim(dim, x.ndim)
    s, e, st = norm_slice(x.shape[dim], start, end, step)
    return lax.slice_in_dim(x, s, e, st, axis=dim)


def _infer_size(size, numel: int) -> tuple[int, ...]:
    size = [int(s) for s in size]
    if size.count(-1) == 1:
        rest = math.prod(s for s in size if s != -1)
        size[size.index(-1)] = numel // rest if rest else 0
    return tuple(size)


@lower(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default)
def view(self, size=None, shape=None):
    return jnp.reshape(self, _infer_size(size if size is not None else shape, self.size))


@lower(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(self, dtype):
    target = to_jnp_dtype(dtype)
    if jnp.dtype(target).itemsize != self.dtype.itemsize:
        raise NotImplementedError(f"torch_bridge: view(dtype) from {self.dtype} to {dtype} changes the item size "
                                  "(or crosses the 64->32-bit narrowing); only same-width bitcasts are supported")
    return lax.bitcast_convert_type(self, target)


@lower(aten.permute.default, aten.permute_copy.default)
def permute(self, dims):
    return jnp.transpose(self, [wrap_dim(d, self.ndim) for d in dims])


@lower(aten.transpose.int, aten.transpose_copy.int, aten.swapaxes.default)
def transpose(self, dim0=None, dim1=None, axis0=None, axis1=None):
    a, b = (dim0, dim1) if dim0 is not None else (axis0, axis1)
    if self.ndim == 0:
        return self
    return jnp.swapaxes(self, wrap_dim(a, self.ndim), wrap_dim(b, self.ndim))


@lower(aten.t.default, aten.t_copy.default)
def t(self):
    if self.ndim > 2:
        raise ValueError("torch_bridge: t() expects a tensor with <= 2 dims")
    return self.T


@lower(aten.movedim.int, aten.movedim.intlist)
def movedim(self, source, destination):
    src = [source] if isinstance(source, int) else source
    dst = [destination] if isinstance(destination, int) else destination
    return jnp.moveaxis(self, [wrap_dim(d, self.ndim) for d in src], [wrap_dim(d, self.ndim) for d in dst])


@lower(aten.expand.default, aten.expand_copy.default)
def expand(self, size, implicit=False):
    size = [int(s) for s in size]
    lead = len(size) - self.ndim
    if lead < 0:
        raise ValueError(f"torch_bridge: expand to {size} has fewer dims than the tensor ({self.shape})")
    shape = [self.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(self, shape)


@lower(aten.expand_as.default)
def expand_as(self, other):
    return jnp.broadcast_to(self, other.shape)


@lower(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(self):
    return jnp.reshape(self, [s for s in self.shape if s != 1])


@lower(aten.squeeze.dims, aten.squeeze_copy.dims, aten.squeeze.dim, aten.squeeze_copy.dim)
def squeeze_dims(self, dim):
    """squeeze.dim / squeeze.dims: only dims of size 1 go; naming any other dim is a no-op, as in torch."""
    dims = [dim] if isinstance(dim, int) else list(dim)
    if self.ndim == 0:
        for d in dims:
            wrap_dim(d, 0)
        return self
    drop = {wrap_dim(d, self.ndim) for d in dims}
    return jnp.reshape(self, [s for i, s in enumerate(self.shape) if not (i in drop and s == 1)])


@lower(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(self, dim):
    return jnp.expand_dims(self, wrap_dim(dim, self.ndim + 1))


@lower(aten.flatten.using_ints)
def flatten(self, start_dim=0, end_dim=-1):
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    s, e = wrap_dim(start_dim, self.ndim), wrap_dim(end_dim, self.ndim)
    return jnp.reshape(self, self.shape[:s] + (math.prod(self.shape[s:e + 1]),) + self.shape[e + 1:])


@lower(aten.unflatten.int)
def unflatten(self, dim, sizes):
    d = wrap_dim(dim, self.ndim)
    return jnp.reshape(self, self.shape[:d] + _infer_size(sizes, self.shape[d]) + self.shape[d + 1:])


@lower(aten.cat.default)
def cat(tensors, dim=0):
    # torch still skips legacy empty 1-d tensors (shape (0,)) whatever the other tensors' ranks are
    kept = [x for x in tensors if not (x.ndim == 1 and x.shape[0] == 0)] or list(tensors)
    dtype = jnp.result_type(*tensors)
    return jnp.concatenate([x.astype(dtype) for x in kept], axis=wrap_dim(dim, kept[0].ndim))


@lower(aten.stack.default)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=wrap_dim(dim, tensors[0].ndim + 1))


def _split_sizes(x, sizes, dim):
    dim = wrap_dim(dim, x.ndim)
    if sum(sizes) != x.shape[dim]:
        raise ValueError(f"torch_bridge: split sizes {sizes} do not sum to dim {dim} of size {x.shape[dim]}")
    out, at = [], 0
    for s in sizes:
        out.append(lax.slice_in_dim(x, at, at + int(s), axis=dim))
        at += int(s)
    return out


@lower(aten.split_with_sizes.default, aten.split_with_sizes_copy.default, aten.split.sizes)
def split_with_sizes(self, split_sizes=None, dim=0, split_size=None):
    return _split_sizes(self, list(split_sizes if split_sizes is not None else split_size), dim)


@lower(aten.split.Tensor, aten.split_copy.Tensor)
def split(self, split_size, dim=0):
    n = self.shape[wrap_dim(dim, self.ndim)]
    split_size = int(split_size)
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if split_size else [0]
    return _split_sizes(self, sizes or [0], dim)


@lower(aten.chunk.default)
def chunk(self, chunks, dim=0):
    n = self.shape[wrap_dim(dim, self.ndim)]
    return split(self, max(-(-n // int(chunks)), 1), dim)


@lower(aten.unbind.int, aten.unbind_copy.int)
def unbind(self, dim=0):
    dim = wrap_dim(dim, self.ndim)
    return [lax.index_in_dim(self, i, axis=dim, keepdims=False) for i in range(self.shape[dim])]


@lower(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(self, dim=0, start=None, end=None, step=1):
    return _slice(self, dim, start, end, step)


@lower(aten.narrow.default)
def narrow(self, dim, start, length):
    d = wrap_dim(dim, self.ndim)
    start = int(start) + self.shape[d] if int(start) < 0 else int(start)
    return lax.slice_in_dim(self, start, start + int(length), axis=d)


@lower(aten.select.int, aten.select_copy.int)
def select(self, dim, index):
    d = wrap_dim(dim, self.ndim)
    n = self.shape[d]
    if not -n <= int(index) < n:
        raise IndexError(f"torch_bridge: select index {index} out of range for dim {d} of size {n}")
    return lax.index_in_dim(self, int(index) % n, axis=d, keepdims=False)


@lower(aten.flip.default)
def flip(self, dims):
    if not dims or self.ndim == 0:
        return self
    return jnp.flip(self, axis=tuple(wrap_dim(d, self.ndim) for d in dims))


@lower(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), int(shifts[0])).reshape(self.shape)
    return jnp.roll(self, [int(s) for s in shifts], axis=[wrap_dim(d, self.ndim) for d in dims])


@lower(aten.repeat.default)
def repeat(self, repeats):
    if len(repeats) < self.ndim:
        raise ValueError("torch_bridge: repeat needs at least as many repeats as the tensor has dims")
    return jnp.tile(self, [int(r) for r in repeats])


@lower(aten.tile.default)
def tile(self, dims):
    return jnp.tile(self, [int(r) for r in dims])


@lower(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(self, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(self, offset, wrap_dim(dim1, self.ndim), wrap_dim(dim2, self.ndim))


@lower(aten.unfold.default)
def unfold(self, dimension, size, step):
    """Tensor.unfold: windows of ``size`` every ``step`` along ``dimension``, the window as a new last dim."""
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    d = wrap_dim(dimension, self.ndim)
    count = (self.shape[d] - size) // step + 1
    idx = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    out = jnp.take(self, idx, axis=d)  # (..., count, size, ...)
    return jnp.moveaxis(out, d + 1, -1)


@lower(aten.diff.default)
def diff(self, n=1, dim=-1, prepend=None, append=None):
    d = wrap_dim(dim, self.ndim)
    parts = [p for p in (prepend, self, append) if p is not None]
    x = jnp.concatenate([jnp.broadcast_to(p, self.shape[:d] + (1,) + self.shape[d + 1:]) if p.ndim == 0 else p
                         for p in parts], axis=d) if len(parts) > 1 else self
    for _ in range(n):
        a, b = lax.slice_in_dim(x, 1, None, axis=d), lax.slice_in_dim(x, 0, x.shape[d] - 1, axis=d)
        x = jnp.logical_xor(a, b) if x.dtype == jnp.bool_ else a - b
    return x


@lower(aten.alias.default, aten.alias_copy.default, aten.clone.default, aten.contiguous.default,
       aten.lift_fresh_copy.default, aten.lift_fresh.default)
def identity(self, memory_format=None):
    return self


@lower(aten.detach.default, aten.detach_copy.default)
def detach(self):
    """detach blocks gradients in torch, so it is ``stop_gradient`` here (JAX computes the gradients)."""
    return lax.stop_gradient(self)


@lower(aten._assert_tensor_metadata.default, aten._assert_scalar.default, aten._assert_async.default,
       aten._assert_async.msg)
def assert_noop(*args, **kwargs):
    """Export's runtime assertions: shapes are static here, and value checks cannot raise under jit. No-op."""
    return None


@lower(aten.sym_size.int)
def sym_size(self, dim):
    return self.shape[wrap_dim(dim, self.ndim)]


@lower(aten.sym_size.default)
def sym_sizes(self):
    return list(self.shape)


@lower(aten.sym_numel.default)
def sym_numel(self):
    return self.size


def contiguous_strides(shape) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return strides[::-1]


@lower(aten.sym_stride.int)
def sym_stride(self, dim):
    """Row-major strides: a bridged array has no strides of its own; the contiguous ones are reported."""
    return contiguous_strides(self.shape)[wrap_dim(dim, self.ndim)]


@lower(aten.sym_storage_offset.default)
def sym_storage_offset(self):
    return 0


@lower(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(self, size, stride, storage_offset=None):
    """``as_strided`` over a contiguous ``self`` (storage = ``self`` flattened, offset 0).

    Any size/stride/offset that stays inside ``self``'s elements is lowered: the contiguous case is a reshape,
    others a static gather. Reading past ``self``'s own elements (a view into a larger storage) cannot be
    expressed on an immutable array and raises ``NotImplementedError``.
    """
    size, stride, off = [int(s) for s in size], [int(s) for s in stride], int(storage_offset or 0)
    numel = math.prod(size)
    if numel == 0:
        return jnp.zeros(size, self.dtype)
    last = off + sum((n - 1) * s for n, s in zip(size, stride))
    if off < 0 or min(stride, default=0) < 0 or last >= self.size:
        raise NotImplementedError(
            f"torch_bridge: as_strided(size={size}, stride={stride}, storage_offset={off}) reads outside the "
            f"{self.size} elements of a contiguous {tuple(self.shape)} input; only views within the tensor's own "
            "contiguous storage are supported")
    flat = self.reshape(-1)
    if [st for n, st in zip(size, stride) if n != 1] == [st for n, st in zip(size, contiguous_strides(size))
                                                          if n != 1]:
        return lax.slice_in_dim(flat, off, off + numel).reshape(size)
    idx = np.full(size, off, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx = idx + (np.arange(n) * s).reshape([n if i == d else 1 for i in range(len(size))])
    return flat[idx.astype(np.int32)]


@lower(aten.pixel_shuffle.default)
def pixel_shuffle(self, upscale_factor):
    r = int(upscale_factor)
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    x = jnp.transpose(x, list(range(n)) + [n, n + 3, n + 1, n + 4, n + 2])
    return x.reshape(*lead, c // (r * r), h * r, w * r)


@lower(aten.pixel_unshuffle.default)
def pixel_unshuffle(self, downscale_factor):
    r = int(downscale_factor)
    *lead, c, h, w = self.shape
    x = self.reshape(*lead, c, h // r, r, w // r, r)
    n = len(lead)
    x = jnp.transpose(x, list(range(n)) + [n, n + 2, n + 4, n + 1, n + 3])
    return x.reshape(*lead, c * r * r, h // r, w // r)


@lower(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, int(diagonal))


@lower(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, int(diagonal))


def cast(x, dtype):
    """torch dtype conversion (``dtype`` a torch dtype or None = keep)."""
    return x if dtype is None else x.astype(to_jnp_dtype(dtype))


@lower(aten._to_copy.default)
def to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    """Device, layout and memory format are ignored: placement belongs to JAX."""
    return cast(self, dtype)


@lower(aten.to.dtype)
def to_dtype(self, dtype, non_blocking=False, copy=False, memory_format=None):
    return cast(self, dtype)


@lower(aten.to.dtype_layout)
def to_dtype_layout(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, copy=False,
                    memory_format=None):
    """``x.to(dtype=..., device=...)`` by keyword (Hugging Face's masks): device and layout are JAX's business."""
    return cast(self, dtype)


@lower(aten.to.device)
def to_device(self, device, dtype, non_blocking=False, copy=False, memory_format=None):
    return cast(self, dtype)


@lower(aten.to.other)
def to_other(self, other, non_blocking=False, copy=False, memory_format=None):
    return self.astype(other.dtype)


@lower(aten.type_as.default)
def type_as(self, other):
    return self.astype(other.dtype)


@lower(aten.copy.default)
def copy(self, src, non_blocking=False):
    """Functional ``self.copy_(src)``: ``src`` broadcast to ``self``'s shape, in ``self``'s dtype."""
    return jnp.broadcast_to(src.astype(self.dtype), self.shape)
