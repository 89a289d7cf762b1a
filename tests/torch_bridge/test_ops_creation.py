"""Creation and random lowerings (torch_bridge/ops/creation.py), plus the core-ATen coverage of this op group.

Deterministic ops: parity with the torch op (values, shape, dtype). Random ops: torch's RNG stream cannot be
reproduced, so they are checked for shape/dtype, determinism in the key, and their distribution.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge.ops.creation  # noqa: F401
import torch_bridge.ops.shape  # noqa: F401
from tests.torch_bridge.parity import JitTable
from tests.torch_bridge.test_ops_shape import T, check, run_lowering
from torch_bridge.ops.registry import core_aten_overloads, lookup, registered_ops

aten = torch.ops.aten
_case_no = itertools.count()


def C(op, *args, **kwargs):
    return pytest.param(op, args, kwargs, id=f"{op}-{next(_case_no)}")


x23 = T(2, 3)
xi = T(2, 3, dtype=torch.int64)

CASES = [
    C(aten.arange.default, 5),
    C(aten.arange.default, 5.0),
    C(aten.arange.default, 4, dtype=torch.float32),
    C(aten.arange.start, -3, 4),
    C(aten.arange.start, 0.5, 3),
    C(aten.arange.start_step, 0, 10, 3),
    C(aten.arange.start_step, 10, 0, -3),
    C(aten.arange.start_step, 0, 1, 0.1),
    C(aten.arange.start_step, -1.0, 1.0, 0.25, dtype=torch.float16),
    C(aten.arange.start_step, 0, 10, 2, dtype=torch.int32),
    C(aten.arange.start_step, 5, 5, 1),
    C(aten.full.default, [2, 3], 1.5),
    C(aten.full.default, [2, 3], 7),
    C(aten.full.default, [2], True),
    C(aten.full.default, [3], 2.7, dtype=torch.int64),
    C(aten.full.default, [], -1.0, dtype=torch.bfloat16),
    C(aten.full.default, [2], float("-inf")),
    C(aten.full_like.default, x23, 3),
    C(aten.full_like.default, xi, 2.0, dtype=torch.float32),
    C(aten.full_like.default, x23, True),
    C(aten.zeros.default, [2, 3]),
    C(aten.zeros.default, [2, 0], dtype=torch.int64),
    C(aten.ones.default, [4], dtype=torch.bool),
    C(aten.ones.default, []),
    C(aten.zeros_like.default, xi),
    C(aten.zeros_like.default, x23, dtype=torch.float16),
    C(aten.ones_like.default, xi, dtype=torch.float32),
    C(aten.ones_like.default, x23, memory_format=torch.preserve_format),
    C(aten.new_zeros.default, xi, [3]),
    C(aten.new_ones.default, x23, [2, 2]),
    C(aten.new_ones.default, xi, [1], dtype=torch.bool),
    C(aten.new_full.default, xi, [2], 3),
    C(aten.new_full.default, x23, [2], 3),
    C(aten.scalar_tensor.default, 3),
    C(aten.scalar_tensor.default, 2.5, dtype=torch.float16),
    C(aten.scalar_tensor.default, 1, dtype=torch.int64),
    C(aten.fill.Scalar, x23, 4),
    C(aten.fill.Scalar, xi, 2.5),
    C(aten.fill.Tensor, x23, torch.tensor(2)),
    C(aten.zero.default, xi),
    C(aten.eye.default, 3),
    C(aten.eye.m, 2, 4, dtype=torch.int64),
    C(aten.linspace.default, 0, 1, 5),
    C(aten.linspace.default, -2.5, 7.0, 13),
    C(aten.linspace.default, 3, -3, 1),
    C(aten.linspace.default, 0, 10, 6, dtype=torch.float16),
    C(aten.linspace.Tensor_Tensor, torch.tensor(1.0), torch.tensor(2.0), 4),
    C(aten.tril_indices.default, 3, 4),
    C(aten.triu_indices.default, 4, 3, 1),
]


TABLE = JitTable(CASES)


@pytest.mark.parametrize("op,args,kwargs", CASES)
def test_parity(op, args, kwargs):
    check(op, args, kwargs, rtol=1e-6, atol=1e-6, table=TABLE)


@pytest.mark.parametrize("op,args,kwargs", [
    (aten.empty.memory_format, ([2, 3],), {}),
    (aten.empty.memory_format, ([4],), {"dtype": torch.int64}),
    (aten.empty_strided.default, ([2, 3], [3, 1]), {}),
    (aten.empty_permuted.default, ([2, 3], [1, 0]), {}),
    (aten.empty_like.default, (T(2, 3, dtype=torch.int64),), {}),
    (aten.new_empty.default, (T(2), [3, 1]), {}),
    (aten.new_empty_strided.default, (T(2), [3, 1], [1, 1]), {"dtype": torch.bool}),
])
def test_empty_is_zeros_with_torch_shape_and_dtype(op, args, kwargs):
    want = op(*args, **kwargs)
    got = run_lowering(op, args, kwargs)
    assert got.shape == tuple(want.shape)
    assert got.dtype == jnp.asarray(torch.zeros(0, dtype=want.dtype).numpy()).dtype
    assert not np.asarray(got).any()


def test_local_scalar_dense():
    f = lookup(aten._local_scalar_dense.default).fn
    assert f(jnp.asarray(3.5)) == 3.5 and isinstance(f(jnp.asarray(2, jnp.int32)), int)
    with pytest.raises(NotImplementedError, match="data-dependent under jax.jit"):
        jax.jit(f)(jnp.asarray(1.0))


# -- random ops ------------------------------------------------------------------------------------------------

x_probs = torch.full((200, 100), 0.3)
RANDOM = [
    # op, args, kwargs, expected shape, expected jnp dtype, expected mean (None: skip), expected std
    (aten.rand.default, ([200, 100],), {}, (200, 100), jnp.float32, 0.5, 12 ** -0.5),
    (aten.rand.generator, ([200, 100],), {"generator": None, "dtype": torch.float16}, (200, 100), jnp.float16, 0.5,
     None),
    (aten.randn.default, ([200, 100],), {}, (200, 100), jnp.float32, 0.0, 1.0),
    (aten.randn.default, ([200, 100],), {"dtype": torch.bfloat16}, (200, 100), jnp.bfloat16, 0.0, 1.0),
    (aten.rand_like.default, (T(200, 100),), {}, (200, 100), jnp.float32, 0.5, None),
    (aten.randn_like.default, (T(200, 100),), {"dtype": torch.float16}, (200, 100), jnp.float16, 0.0, 1.0),
    (aten.randint.default, (10, [200, 100]), {}, (200, 100), jnp.int32, 4.5, None),
    (aten.randint.low, (-3, 3, [200, 100]), {"dtype": torch.float32}, (200, 100), jnp.float32, -0.5, None),
    (aten.randint_like.default, (T(200, 100, dtype=torch.int64), 4), {}, (200, 100), jnp.int32, 1.5, None),
    (aten.randint_like.low_dtype, (T(200, 100), 2, 6), {}, (200, 100), jnp.float32, 3.5, None),
    (aten.bernoulli.default, (x_probs,), {}, (200, 100), jnp.float32, 0.3, None),
    (aten.bernoulli.p, (T(200, 100, dtype=torch.int64), 0.8), {}, (200, 100), jnp.int32, 0.8, None),
    (aten.bernoulli.Tensor, (T(200, 100), x_probs), {}, (200, 100), jnp.float32, 0.3, None),
    (aten.uniform.default, (T(200, 100), -2.0, 4.0), {}, (200, 100), jnp.float32, 1.0, 6 * 12 ** -0.5),
    (aten.normal.Tensor_float, (torch.full((200, 100), 3.0), 2.0), {}, (200, 100), jnp.float32, 3.0, 2.0),
    (aten.normal.Tensor_Tensor, (torch.zeros(200, 1), torch.full((100,), 0.5)), {}, (200, 100), jnp.float32, 0.0,
     0.5),
    (aten.normal.float_float, (1.0, 3.0, [200, 100]), {}, (200, 100), jnp.float32, 1.0, 3.0),
    (aten.randperm.default, (20000,), {}, (20000,), jnp.int32, 9999.5, None),
]


@pytest.mark.parametrize("op,args,kwargs,shape,dtype,mean,std", RANDOM, ids=[str(r[0]) for r in RANDOM])
def test_random(op, args, kwargs, shape, dtype, mean, std):
    assert lookup(op).random
    want = op(*args, **kwargs)  # torch's own result: same shape and (narrowed) dtype
    assert tuple(want.shape) == shape
    k1, k2 = jax.random.split(jax.random.key(0))
    a = run_lowering(op, args, kwargs, key=k1)
    b = run_lowering(op, args, kwargs, key=k1)
    c = run_lowering(op, args, kwargs, key=k2)
    assert a.shape == shape and a.dtype == dtype
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert not np.array_equal(np.asarray(a, np.float32), np.asarray(c, np.float32))
    v = np.asarray(a, np.float64)
    scale = std if std is not None else max(abs(mean), 1.0)
    assert abs(v.mean() - mean) < 0.05 * scale, v.mean()
    assert abs(v.mean() - want.double().mean().item()) < 0.1 * scale
    if std is not None:
        assert abs(v.std() - std) < 0.05 * std, v.std()


def test_random_ranges():
    key = jax.random.key(1)
    r = np.asarray(run_lowering(aten.randint.low, (-3, 3, [5000]), key=key))
    assert r.min() == -3 and r.max() == 2
    u = np.asarray(run_lowering(aten.uniform.default, (T(5000), -2.0, 4.0), key=key))
    assert u.min() >= -2.0 and u.max() < 4.0
    p = np.asarray(run_lowering(aten.randperm.default, (50,), key=key))
    assert sorted(p.tolist()) == list(range(50))
    b = np.asarray(run_lowering(aten.bernoulli.default, (x_probs,), key=key))
    assert set(np.unique(b).tolist()) <= {0.0, 1.0}


# -- coverage --------------------------------------------------------------------------------------------------

OWNED_CORE = {
    "_local_scalar_dense.default", "_to_copy.default", "alias.default", "arange.start_step", "as_strided.default",
    "cat.default", "clone.default", "copy.default", "diagonal.default", "empty.memory_format",
    "empty_strided.default", "expand.default", "fill.Scalar", "flip.default", "full.default", "full_like.default",
    "gather.default", "index.Tensor", "index_put.default", "index_select.default", "masked_scatter.default",
    "nonzero.default", "permute.default", "rand.default", "randn.default", "randperm.default", "repeat.default",
    "scalar_tensor.default", "scatter.src", "scatter.value", "scatter_add.default", "scatter_reduce.two",
    "select.int", "select_scatter.default", "slice.Tensor", "slice_scatter.default", "sort.default",
    "split_with_sizes.default", "squeeze.dim", "squeeze.dims", "sym_numel.default", "sym_size.int",
    "sym_storage_offset.default", "sym_stride.int", "topk.default", "unsqueeze.default", "view.default",
}


MY_MODULES = {"torch_bridge.ops.shape", "torch_bridge.ops.indexing", "torch_bridge.ops.creation"}


def test_core_overloads_covered():
    core = {str(op).removeprefix("aten."): op for op in core_aten_overloads()}
    assert OWNED_CORE <= set(core), OWNED_CORE - set(core)
    ours = {name for name, op in core.items()
            if op in registered_ops() and lookup(op).fn.__module__ in MY_MODULES}
    assert OWNED_CORE <= ours, OWNED_CORE - ours
