"""Indexing, gather/scatter and sorting lowerings.

Under ``jax.jit`` every shape is static. Ops whose output shape depends on tensor *values* (``nonzero``,
``masked_select``, indexing with a boolean mask) cannot be traced; they raise ``NotImplementedError`` naming the op
and the jittable alternative, unless the mask is a concrete (non-traced) array, where it is resolved eagerly.
Out-of-range indices: torch raises ``IndexError: index out of range in self``. Where the indices are concrete
(an eager call) :func:`checked_rows` raises the same error; under ``jax.jit`` their values are unknown, so
``embedding`` and ``index_select`` instead return NaN rows for an index outside ``[0, size)`` (negative ones
included, which numpy-style indexing would wrap): a float model's loss turns non-finite and the Trainer stops
there (``nonfinite='raise'``). Other gathers follow JAX's rules (clamp on read, drop on write).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from torch_bridge.ops.registry import lower
from torch_bridge.ops.shape import norm_slice, wrap_dim

aten = __import__("torch").ops.aten

_MASK_HELP = ("a boolean mask index selects a data-dependent number of elements, so the result has no static shape "
              "and cannot be traced by jax.jit. Rewrite the model with torch.where(mask, x, y) / masked_fill, or "
              "multiply by the mask and reduce")


def _is_mask(i) -> bool:
    return i is not None and i.dtype in (jnp.bool_, jnp.uint8)


def _index_tuple(x, indices, op: str):
    """torch's ``Tensor?[] indices`` as a numpy-style index tuple (None = ``:``; concrete masks -> positions)."""
    out = []
    for i in indices:
        if i is None:
            out.append(slice(None))
        elif _is_mask(i):
            if isinstance(i, jax.core.Tracer):
                raise NotImplementedError(f"torch_bridge: {op} with a boolean mask: {_MASK_HELP}")
            out.extend(jnp.asarray(p, jnp.int32) for p in np.nonzero(np.asarray(i).astype(bool)))
        else:
            out.append(i)
    return tuple(out)


@lower(aten.index.Tensor, aten.index.Tensor_hacked_twin)
def index(self, indices):
    """Advanced indexing; torch's rules (broadcast index tensors, where the result dims land) are numpy's."""
    return self[_index_tuple(self, indices, "aten.index.Tensor")]


def _mask_put(self, indices, values, accumulate):
    """``x[mask] = v`` with a traced mask: a ``where`` when ``v`` broadcasts over the selected elements."""
    lead = 0
    while indices[lead] is None:
        lead += 1
    mask, rest = indices[lead].astype(bool), indices[lead + 1:]
    tail = self.shape[lead + mask.ndim:]
    if any(i is not None for i in rest) or lead:
        raise NotImplementedError(f"torch_bridge: index_put with a traced boolean mask mixed with other indices: "
                                  f"{_MASK_HELP}")
    v = values.astype(self.dtype)
    if v.ndim == len(tail) + 1:
        if v.shape[0] != 1:
            raise NotImplementedError("torch_bridge: index_put with a traced boolean mask and one value per "
                                      f"selected element: {_MASK_HELP} (or use masked_scatter)")
        v = v[0]
    m = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * len(tail)), self.shape)
    v = jnp.broadcast_to(v, self.shape)
    return self + jnp.where(m, v, jnp.zeros((), self.dtype)) if accumulate else jnp.where(m, v, self)


@lower(aten.index_put.default, aten.index_put.hacked_twin)
def index_put(self, indices, values, accumulate=False):
    """Functional ``x[indices] = values`` (``accumulate``: ``+=``, duplicates summed as torch does)."""
    if any(_is_mask(i) and isinstance(i, jax.core.Tracer) for i in indices):
        return _mask_put(self, list(indices), values, accumulate)
    at = self.at[_index_tuple(self, indices, "aten.index_put")]
    values = values.astype(self.dtype)
    return at.add(values) if accumulate else at.set(values)


def checked_rows(index, size: int, op: str):
    """``index`` with every entry outside ``[0, size)`` sent past the end, where ``jnp.take``'s default ``fill``
    mode gives NaN (floats); concrete out-of-range indices raise torch's error instead (module docstring)."""
    if not isinstance(index, jax.core.Tracer):
        bad = (np.asarray(index) < 0) | (np.asarray(index) >= size)
        if bad.any():
            found = np.asarray(index)[bad]
            raise IndexError(f"index out of range in self ({op}: index {int(found[0])} with size {size}; "
                             f"{int(bad.sum())} of {bad.size} indices outside [0, {size}))")
    return jnp.where(index < 0, size, index)


@lower(aten.index_select.default)
def index_select(self, dim, index):
    if self.ndim == 0:
        return jnp.take(self.reshape(1), checked_rows(index.reshape(-1), 1, "index_select")).reshape(index.shape)
    axis = wrap_dim(dim, self.ndim)
    return jnp.take(self, checked_rows(index.reshape(-1), self.shape[axis], "index_select"), axis=axis)


def _dim_index(ndim, dim, index):
    return (slice(None),) * wrap_dim(dim, ndim) + (index,)


@lower(aten.index_add.default)
def index_add(self, dim, index, source, alpha=1):
    src = source * alpha if alpha != 1 else source
    if self.ndim == 0:
        return self + src.astype(self.dtype).sum()
    return self.at[_dim_index(self.ndim, dim, index)].add(src.astype(self.dtype))


@lower(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(self, dim, index, value):
    if self.ndim == 0:
        return jnp.asarray(value, self.dtype)
    return self.at[_dim_index(self.ndim, dim, index.reshape(-1))].set(jnp.asarray(value, self.dtype))


def _sub(x, shape):
    return x[tuple(slice(0, n) for n in shape)]


@lower(aten.gather.default)
def gather(self, dim, index, sparse_grad=False):
    if self.ndim == 0:
        return jnp.broadcast_to(self, index.shape)
    d = wrap_dim(dim, self.ndim)
    # index may be smaller than self in every dim; only the dims other than `dim` are cut to index's extent
    x = _sub(self, [self.shape[i] if i == d else n for i, n in enumerate(index.shape)])
    return jnp.take_along_axis(x, index, axis=d)


def _scatter_at(self, dim, index):
    if self.ndim == 0:
        return self.reshape(1).at[index.reshape(-1)], True
    d = wrap_dim(dim, self.ndim)
    coords = tuple(index if i == d else lax.broadcasted_iota(index.dtype, index.shape, i) for i in range(index.ndim))
    return self.at[coords], False


def _scatter_apply(self, dim, index, src, method):
    at, scalar = _scatter_at(self, dim, index)
    if not isinstance(src, (int, float, bool)):
        src = _sub(src, index.shape).reshape(index.reshape(-1).shape if scalar else index.shape)
    out = getattr(at, method)(jnp.asarray(src, self.dtype))
    return out.reshape(()) if scalar else out


@lower(aten.scatter.src, aten.scatter.value)
def scatter(self, dim, index, src=None, value=None):
    return _scatter_apply(self, dim, index, src if src is not None else value, "set")


@lower(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_legacy_reduce(self, dim, index, src=None, value=None, reduce="add"):
    method = {"add": "add", "multiply": "multiply"}[reduce]
    return _scatter_apply(self, dim, index, src if src is not None else value, method)


@lower(aten.scatter_add.default)
def scatter_add(self, dim, index, src):
    return _scatter_apply(self, dim, index, src, "add")


def _identity(reduce, dtype):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    inf = jnp.inf if jnp.issubdtype(dtype, jnp.floating) else None
    if reduce == "amax":
        return -inf if inf is not None else info.min
    return inf if inf is not None else info.max


@lower(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    """scatter_reduce with sum/prod/mean/amax/amin; ``include_self=False`` ignores self where anything lands."""
    methods = {"sum": "add", "mean": "add", "prod": "multiply", "amax": "max", "amin": "min"}
    if reduce not in methods:
        raise NotImplementedError(f"torch_bridge: scatter_reduce reduce={reduce!r}")
    base = self if include_self else _scatter_apply(self, dim, index, _identity(reduce, self.dtype), "set")
    out = _scatter_apply(base, dim, index, src, methods[reduce])
    if reduce == "mean":
        count = _scatter_apply(jnp.full(self.shape, int(include_self), self.dtype), dim, index, 1, "add")
        count = jnp.where(count == 0, jnp.ones((), self.dtype), count)
        out = out / count if jnp.issubdtype(self.dtype, jnp.inexact) else jnp.floor_divide(out, count)
    return out


@lower(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    d = wrap_dim(dim, self.ndim)
    return self.at[(slice(None),) * d + (int(index) % self.shape[d],)].set(src.astype(self.dtype))


@lower(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    d = wrap_dim(dim, self.ndim)
    s, e, st = norm_slice(self.shape[d], start, end, step)
    return self.at[(slice(None),) * d + (slice(s, e, st),)].set(src.astype(self.dtype))


@lower(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    """Jittable despite the data-dependent count: the k-th True takes ``source.flatten()[k]`` (a cumsum gather)."""
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    flat_mask = jnp.broadcast_to(mask.astype(bool), shape).reshape(-1)
    pos = jnp.clip(jnp.cumsum(flat_mask.astype(jnp.int32)) - 1, 0, max(source.size - 1, 0))
    taken = source.reshape(-1)[pos].astype(self.dtype) if source.size else jnp.zeros(pos.shape, self.dtype)
    return jnp.where(flat_mask, taken, jnp.broadcast_to(self, shape).reshape(-1)).reshape(shape)


@lower(aten.nonzero.default, aten.masked_select.default)
def data_dependent(self, mask=None):
    op = "masked_select" if mask is not None else "nonzero"
    raise NotImplementedError(
        f"torch_bridge: aten.{op} returns a tensor whose length depends on the data, which jax.jit cannot trace "
        "(static shapes only). Use torch.where / masked_fill, or torch.nonzero_static(x, size=N) for a fixed bound")


@lower(aten.nonzero_static.default)
def nonzero_static(self, size, fill_value=-1):
    if self.ndim == 0:
        return jnp.zeros((int(size), 0), jnp.int32)
    found = jnp.nonzero(self, size=int(size), fill_value=fill_value)
    return jnp.stack(found, axis=1).astype(jnp.int32)


def _argsort(x, d, descending):
    return jnp.argsort(x, axis=d, stable=True, descending=descending).astype(jnp.int32)


@lower(aten.sort.default, aten.sort.stable)
def sort(self, dim=-1, descending=False, stable=None):
    """Stable sort (torch's stable=False makes no order promise for ties, so stable is always valid)."""
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = wrap_dim(dim, self.ndim)
    idx = _argsort(self, d, descending)
    return jnp.take_along_axis(self, idx, axis=d), idx


@lower(aten.argsort.default, aten.argsort.stable)
def argsort(self, dim=-1, descending=False, stable=None):
    return sort(self, dim, descending)[1]


@lower(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):
    """Values and indices of the k largest (smallest); always sorted, which ``sorted=False`` permits."""
    k = int(k)
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = wrap_dim(dim, self.ndim)
    if largest and self.dtype != jnp.bool_:
        vals, idx = lax.top_k(jnp.moveaxis(self, d, -1), k)
        return jnp.moveaxis(vals, -1, d), jnp.moveaxis(idx.astype(jnp.int32), -1, d)
    idx = lax.slice_in_dim(_argsort(self, d, largest), 0, k, axis=d)
    return jnp.take_along_axis(self, idx, axis=d), idx
