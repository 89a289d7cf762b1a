"""Parity of the shape/view/dtype lowerings (torch_bridge/ops/shape.py) with the torch ops themselves.

Each case calls ``torch.ops.aten.<op>.<overload>`` and the lowering (eagerly and under ``jax.jit`` with the
non-tensor arguments static) and compares values, shapes and dtypes (int64 -> int32, float64 -> float32).
The harness (``check``, ``run_lowering``, ``T``) is shared with test_ops_indexing.py and test_ops_creation.py.
"""
from __future__ import annotations

import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge.ops.shape  # noqa: F401  (registers shape + indexing lowerings)
from tests.torch_bridge.parity import JitTable, run_lowering
from torch_bridge.ops.registry import lookup, to_numpy

aten = torch.ops.aten
_gen = torch.Generator().manual_seed(0)


def T(*shape, dtype=torch.float32, low=-5, high=5):
    """A random torch tensor (ints in [low, high), bools, or standard normal floats)."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=_gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(low, high, shape, generator=_gen, dtype=dtype)
    return torch.randn(shape, generator=_gen).to(dtype)


def assert_same(expected, got, rtol=1e-6, atol=1e-6):
    if isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), (type(got), len(got))
        for e, g in zip(expected, got):
            assert_same(e, g, rtol, atol)
        return
    if not isinstance(expected, torch.Tensor):
        assert got == expected, (got, expected)
        return
    want = to_numpy(expected)
    g = np.asarray(got)
    assert g.shape == want.shape, (g.shape, want.shape)
    assert g.dtype == want.dtype, (g.dtype, want.dtype)
    if want.dtype == jnp.bfloat16:
        g, want = g.astype(np.float32), want.astype(np.float32)
    np.testing.assert_allclose(g, want, rtol=rtol, atol=atol)


def check(op, args=(), kwargs=None, jit=True, rtol=1e-6, atol=1e-6, table: JitTable | None = None):
    """The lowering equals the torch op under jit (the row's result from ``table`` if given; skipped without
    ``jit``) and eagerly: always without ``jit`` or a table, else on the overload's first row of the table."""
    expected = op(*args, **(kwargs or {}))
    if not jit or table is None or table.checks_eagerly(op, args):
        assert_same(expected, run_lowering(op, args, kwargs, jit=False), rtol, atol)
    if jit:
        got = table.run(op, args, kwargs) if table is not None else run_lowering(op, args, kwargs, jit=True)
        assert_same(expected, got, rtol, atol)


_case_no = itertools.count()


def C(op, *args, **kwargs):
    """One table row: ``op(*args, **kwargs)``."""
    return pytest.param(op, args, kwargs, id=f"{op}-{next(_case_no)}")


x234 = T(2, 3, 4)
big = sys.maxsize

CASES = [
    C(aten.view.default, x234, [4, -1]),
    C(aten.view.default, x234, [-1]),
    C(aten.view.default, T(), [1, 1]),
    C(aten.view.default, T(2, 0, 3), [-1, 3]),
    C(aten.view.dtype, T(2, 3), torch.int32),
    C(aten._unsafe_view.default, x234, [2, 12]),
    C(aten.reshape.default, x234, [3, -1, 2]),
    C(aten.permute.default, x234, [2, 0, 1]),
    C(aten.permute.default, x234, [-1, -3, 1]),
    C(aten.transpose.int, x234, 0, -1),
    C(aten.transpose.int, T(), 0, -1),
    C(aten.t.default, T(3, 5)),
    C(aten.t.default, T(3)),
    C(aten.movedim.int, x234, 0, -1),
    C(aten.movedim.intlist, x234, [0, 1], [-1, 0]),
    C(aten.swapaxes.default, x234, 1, 2),
    C(aten.expand.default, T(3, 1), [2, -1, 4]),
    C(aten.expand.default, T(1), [5]),
    C(aten.expand.default, T(), [2, 3]),
    C(aten.expand_as.default, T(1, 4), T(3, 4)),
    C(aten.squeeze.default, T(1, 3, 1, 2)),
    C(aten.squeeze.dim, T(1, 3, 1), -1),
    C(aten.squeeze.dim, T(2, 3), 0),  # size != 1: no-op
    C(aten.squeeze.dim, T(), 0),
    C(aten.squeeze.dims, T(1, 3, 1, 2), [0, -2, 1]),
    C(aten.unsqueeze.default, x234, -1),
    C(aten.unsqueeze.default, x234, 0),
    C(aten.unsqueeze.default, x234, -4),
    C(aten.unsqueeze.default, T(), 0),
    C(aten.flatten.using_ints, x234, 1, -1),
    C(aten.flatten.using_ints, x234),
    C(aten.flatten.using_ints, T()),
    C(aten.unflatten.int, x234, -1, [2, -1]),
    C(aten.cat.default, [T(2, 3), T(1, 3)]),
    C(aten.cat.default, [T(2, 3), T(2, 1), T(2, 2)], -1),
    C(aten.cat.default, [T(2, 3), T(0)], 0),  # legacy empty 1-d tensor is skipped
    C(aten.cat.default, [T(2, 3), T(2, 3, dtype=torch.int64)], 1),  # promotion
    C(aten.stack.default, [T(2, 3), T(2, 3)], -1),
    C(aten.stack.default, [T(2, 3), T(2, 3), T(2, 3)]),
    C(aten.split.Tensor, T(7, 2), 3),
    C(aten.split.Tensor, T(2, 6), 2, -1),
    C(aten.split.Tensor, T(2, 6), 10, -1),
    C(aten.split_with_sizes.default, T(7, 2), [2, 0, 5]),
    C(aten.split_with_sizes.default, T(2, 7), [3, 4], -1),
    C(aten.chunk.default, T(7, 2), 3),
    C(aten.chunk.default, T(2, 5), 5, -1),
    C(aten.chunk.default, T(2, 6), 4, 1),
    C(aten.unbind.int, x234, -1),
    C(aten.unbind.int, x234),
    C(aten.slice.Tensor, x234, 2, 1, big),
    C(aten.slice.Tensor, x234, -1, -3, -1),
    C(aten.slice.Tensor, x234, 1, 0, big, 2),
    C(aten.slice.Tensor, x234, 0, None, None),
    C(aten.slice.Tensor, x234, 2, 3, 1),  # empty
    C(aten.slice.Tensor, x234, 2, -100, 100, 3),
    C(aten.select.int, x234, 1, -1),
    C(aten.select.int, x234, -1, 2),
    C(aten.narrow.default, x234, -1, 1, 2),
    C(aten.narrow.default, x234, 0, -1, 1),
    C(aten.flip.default, x234, [0, -1]),
    C(aten.flip.default, x234, []),
    C(aten.roll.default, x234, [1], [-1]),
    C(aten.roll.default, x234, [2, -1], [0, 1]),
    C(aten.roll.default, x234, [5]),
    C(aten.repeat.default, T(2, 3), [2, 1, 3]),
    C(aten.repeat.default, T(2, 3), [1, 2]),
    C(aten.tile.default, T(2, 3), [2]),
    C(aten.diagonal.default, T(4, 5)),
    C(aten.diagonal.default, x234, 1, -1, 0),
    C(aten.diagonal.default, x234, -1, 1, 2),
    C(aten.unfold.default, T(2, 9), -1, 3, 2),
    C(aten.unfold.default, T(5, 2), 0, 2, 1),
    C(aten.diff.default, T(3, 5)),
    C(aten.diff.default, T(3, 5), 2, 0),
    C(aten.diff.default, T(3, 5, dtype=torch.int64), 1, -1, T(3, 1, dtype=torch.int64), T(3, 2, dtype=torch.int64)),
    C(aten.diff.default, T(4, dtype=torch.bool)),
    C(aten.alias.default, x234),
    C(aten.clone.default, x234),
    C(aten.contiguous.default, x234),
    C(aten.detach.default, x234),
    C(aten.lift_fresh_copy.default, x234),
    C(aten.as_strided.default, T(4, 6), [6, 4], [4, 1]),
    C(aten.as_strided.default, T(4, 6), [3, 2], [1, 3], 2),
    C(aten.as_strided.default, T(10), [3, 3], [2, 1]),  # overlapping windows
    C(aten.as_strided.default, T(4, 6), [2, 5], [6, 1], 12),
    C(aten.pixel_shuffle.default, T(2, 8, 3, 5), 2),
    C(aten.pixel_shuffle.default, T(18, 2, 2), 3),
    C(aten.pixel_unshuffle.default, T(2, 2, 4, 6), 2),
    C(aten.triu.default, T(4, 5)),
    C(aten.triu.default, x234, -1),
    C(aten.tril.default, T(4, 5), 2),
    C(aten.tril.default, T(3, 3, dtype=torch.int64)),
    C(aten._to_copy.default, x234, dtype=torch.int64),
    C(aten._to_copy.default, x234, dtype=torch.bool),
    C(aten._to_copy.default, x234, dtype=torch.float16, device="cpu"),
    C(aten._to_copy.default, x234, dtype=torch.bfloat16),
    C(aten._to_copy.default, T(3, dtype=torch.int64), dtype=torch.float32),
    C(aten._to_copy.default, x234),
    C(aten.to.dtype, x234, torch.int32),
    C(aten.to.device, x234, torch.device("cpu"), torch.float16),
    C(aten.to.dtype_layout, x234, dtype=torch.bfloat16, device=torch.device("cpu")),
    C(aten.to.dtype_layout, T(3, dtype=torch.int64)),
    C(aten.to.other, x234, T(2, dtype=torch.int64)),
    C(aten.type_as.default, T(3, dtype=torch.int64), T(2)),
    C(aten.copy.default, T(2, 3), T(3, dtype=torch.int64)),
    C(aten.copy.default, T(2, 3, dtype=torch.int64), T(2, 3)),
]


TABLE = JitTable(CASES)


@pytest.mark.parametrize("op,args,kwargs", CASES)
def test_parity(op, args, kwargs):
    check(op, args, kwargs, table=TABLE)


@pytest.mark.parametrize("op,args,expected", [
    (aten.sym_size.int, (T(2, 3, 4), -1), 4),
    (aten.sym_size.int, (T(2, 3, 4), 0), 2),
    (aten.sym_numel.default, (T(2, 3, 4),), 24),
    (aten.sym_stride.int, (T(2, 3, 4), 0), 12),
    (aten.sym_stride.int, (T(2, 3, 4), -1), 1),
    (aten.sym_storage_offset.default, (T(2, 3),), 0),
])
def test_sym_ops_static_ints(op, args, expected):
    assert op(*args) == expected
    got = run_lowering(op, args, jit=False)
    assert got == expected and isinstance(got, int)


def test_asserts_are_noops():
    x = T(2, 3)
    assert run_lowering(aten._assert_tensor_metadata.default, (x,), {"size": [2, 3], "dtype": torch.float32}) is None
    assert run_lowering(aten._assert_scalar.default, (True, "msg"), jit=False) is None


def test_detach_stops_gradient():
    f = lookup(aten.detach.default).fn
    g = jax.grad(lambda x: (f(x) * x).sum())(jnp.arange(3.0))
    np.testing.assert_allclose(g, np.arange(3.0))


def test_as_strided_outside_storage_raises():
    with pytest.raises(NotImplementedError, match="as_strided"):
        run_lowering(aten.as_strided.default, (T(2, 3), [3, 3], [1, 1], 2), jit=False)


def test_split_returns_list():
    out = run_lowering(aten.split_with_sizes.default, (T(5, 2), [2, 3]), jit=False)
    assert isinstance(out, list) and [o.shape for o in out] == [(2, 2), (3, 2)]
