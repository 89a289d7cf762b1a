"""Parity of the reduction/scan lowerings with the ATen ops themselves (values, dtypes, shapes, eager and under
``jax.jit``), gradient parity where torch's choice is specific, and the core-ATen coverage of ``reduction.py``."""
import math

import numpy as np
import pytest
import torch

import torch_bridge.ops.reduction as reduction
from torch_bridge.ops.registry import core_aten_overloads, lookup, registered_ops
from tests.torch_bridge.parity import JitTable, assert_signature_matches_schema, check_parity, grads_against_torch

aten = torch.ops.aten
_g = torch.Generator().manual_seed(1)


def F(*s):  # noqa: N802 - float32 normal
    return torch.randn(s, generator=_g)


def U(*s):  # noqa: N802 - in (-1.5, 1.5), for products
    return torch.rand(*s, generator=_g) * 3 - 1.5


def I(*s, lo=-6, hi=7):  # noqa: N802, E743 - int64
    return torch.randint(lo, hi, s, generator=_g)


def B(*s):  # noqa: N802
    return torch.rand(*s, generator=_g) > 0.5


def H(*s):  # noqa: N802
    return F(*s).half()


def with_nan(x):
    x = x.clone()
    x.view(-1)[3] = math.nan
    return x


def with_ties(*s):
    return torch.randint(0, 3, s, generator=_g).float()


EXACT, LOOSE, HALF = (1e-6, 1e-6), (1e-5, 1e-5), (2e-3, 2e-3)
ROWS = []


def row(op, *args, tol=LOOSE, **kwargs):
    ROWS.append(pytest.param(op, args, kwargs, tol, id=f"{op}-{len(ROWS)}"))


# sum / nansum / mean / prod / count_nonzero
for dim, keep in (([1], False), ([0, 2], False), ([-1], True), ([-3, -1], True), (None, False), ([], False),
                  ([], True)):
    row(aten.sum.dim_IntList, F(3, 4, 5), dim, keep)
    row(aten.mean.dim, F(3, 4, 5), dim, keep)
    row(aten.amax.default, F(3, 4, 5), dim or [], keep)
    row(aten.amin.default, F(3, 4, 5), dim or [], keep)
row(aten.sum.dim_IntList, I(3, 4), [1])                          # int -> int64
row(aten.sum.dim_IntList, B(3, 4), [0], True)                    # bool -> int64
row(aten.sum.dim_IntList, I(3, 4), [1], dtype=torch.float32)
row(aten.sum.dim_IntList, F(3, 4), [1], dtype=torch.float64)
row(aten.sum.dim_IntList, I(3, 4).to(torch.int8) * 20, [1])      # int8 accumulates in int64
row(aten.sum.dim_IntList, H(3, 64), [1], tol=HALF)
row(aten.sum.dim_IntList, F(), [0])                              # dim 0 of a 0-dim tensor
row(aten.sum.default, F(3, 4, 5))
row(aten.sum.default, I(3, 4))
row(aten.sum.default, B(3, 4))
row(aten.sum.default, B(3, 4), dtype=torch.int32)
row(aten.nansum.default, with_nan(F(3, 4)))
row(aten.nansum.default, with_nan(F(3, 4)), [1], True)
row(aten.mean.dim, I(3, 4), [1], dtype=torch.float32)
row(aten.mean.dim, H(3, 64), [-1], tol=HALF)
row(aten.mean.dim, with_nan(F(3, 4)), [1])
row(aten.mean.default, F(3, 4, 5))
row(aten.mean.default, I(3, 4), dtype=torch.float32)
for dim, keep in ((1, False), (-1, True), (0, False)):
    row(aten.prod.dim_int, U(3, 4, 5), dim, keep)
    row(aten.prod.dim_int, I(3, 4, lo=-3, hi=4), dim, keep)
row(aten.prod.dim_int, B(3, 4), 1)
row(aten.prod.dim_int, I(3, 4), 1, dtype=torch.float32)
row(aten.prod.default, U(3, 4))
row(aten.prod.default, I(2, 3, lo=-3, hi=4))
row(aten.prod.default, B(3, 4))
row(aten.count_nonzero.default, I(3, 4))
row(aten.count_nonzero.default, I(3, 4), 1)
row(aten.count_nonzero.dim_IntList, F(3, 4).round(), [0, 1])

# amax / amin / max / min / argmax / argmin
for x in (I(3, 4), B(3, 4), with_nan(F(3, 4)), with_ties(3, 4)):
    row(aten.amax.default, x, [1])
    row(aten.amin.default, x, [0], True)
    row(aten.amax.default, x)
for x in (F(3, 4, 5), I(3, 4, 5), with_nan(F(3, 4, 5)), with_ties(3, 4, 5), H(3, 4, 5)):
    for dim, keep in ((1, False), (-1, True), (0, False)):
        row(aten.max.dim, x, dim, keep)
        row(aten.min.dim, x, dim, keep)
        row(aten.argmax.default, x, dim, keep)
        row(aten.argmin.default, x, dim, keep)
    row(aten.argmax.default, x)
    row(aten.argmin.default, x, None, True)
    row(aten.max.default, x)
    row(aten.min.default, x)
row(aten.max.other, F(3, 4), F(4))
row(aten.min.other, I(3, 4), I(3, 4))
row(aten.aminmax.default, F(3, 4))
row(aten.aminmax.default, F(3, 4), dim=1, keepdim=True)

# any / all
for x in (B(3, 4, 5), I(3, 4, 5, lo=0, hi=3), F(3, 4, 5).round(), I(3, 4, 5, lo=0, hi=2).to(torch.uint8),
          torch.zeros(3, 4, 5, dtype=torch.bool), torch.ones(3, 4, 5, dtype=torch.bool)):
    for packet in (aten.any, aten.all):
        row(packet.default, x)
        row(packet.dim, x, 1)
        row(packet.dim, x, -1, True)
        row(packet.dims, x, [0, 2])
        row(packet.dims, x, None, True)
        row(packet.dims, x, [-2], True)

# var / std
for dim, keep in (([1], False), ([0, 2], True), ([-1], True), (None, False), ([], False)):
    for correction in (None, 0, 1, 2):
        row(aten.var.correction, F(3, 4, 5), dim, correction=correction, keepdim=keep)
        row(aten.std.correction, F(3, 4, 5), dim, correction=correction, keepdim=keep)
    row(aten.var_mean.correction, F(3, 4, 5), dim, correction=0, keepdim=keep)
    row(aten.std_mean.correction, F(3, 4, 5), dim, keepdim=keep)
for unbiased in (True, False):
    row(aten.var.dim, F(3, 4, 5), [1], unbiased, True)
    row(aten.var.dim, F(3, 4, 5), [0, -1], unbiased)
    row(aten.std.dim, F(3, 4, 5), [1], unbiased, False)
    row(aten.var.default, F(3, 4), unbiased)
    row(aten.std.default, F(3, 4), unbiased)
    row(aten.var_mean.dim, F(3, 4), [1], unbiased, True)
    row(aten.std_mean.dim, F(3, 4), [1], unbiased)
row(aten.var.correction, F(3, 1, 5), [1])                        # N - correction = 0: nan, as torch
row(aten.std.correction, F(3, 2), [1], correction=3)             # N - correction < 0: divisor clamped to 0
row(aten.var.correction, F(3, 4) * 10 + 100, [1], correction=1.5)
row(aten.var.correction, H(3, 64), [1], tol=HALF)

# scans
for x in (F(3, 4, 5), I(3, 4, 5), B(3, 4, 5)):
    for dim in (0, 1, -1):
        row(aten.cumsum.default, x, dim)
row(aten.cumsum.default, I(3, 4), 1, dtype=torch.float32)
row(aten.cumsum.default, B(3, 4), 0, dtype=torch.int32)
row(aten.cumsum.default, H(3, 16), 1, tol=HALF)
row(aten.cumsum.default, F(), 0)
for x in (U(3, 4, 5), I(3, 4, lo=-3, hi=4), B(3, 4)):
    for dim in (0, -1):
        row(aten.cumprod.default, x, dim)
row(aten.cumprod.default, I(3, 4, lo=-3, hi=4), 1, dtype=torch.float32)
row(aten.logcumsumexp.default, F(3, 4, 5), 1)
row(aten.logcumsumexp.default, F(3, 4, 5), -1)

# logsumexp
neg_inf_row = F(3, 4)
neg_inf_row[1] = -math.inf
for dim, keep in (([1], False), ([0, 2], True), ([-1], True)):
    row(aten.logsumexp.default, F(3, 4, 5) * 10, dim, keep)
row(aten.logsumexp.default, neg_inf_row, [1])
row(aten.logsumexp.default, I(3, 4), [1])                        # int -> float32

# norms
for ord_ in (2, 1, 3, 0.5, 0, math.inf, -math.inf, 2.0):
    row(aten.linalg_vector_norm.default, F(3, 4, 5), ord_)
    row(aten.linalg_vector_norm.default, F(3, 4, 5), ord_, [1], True)
    row(aten.linalg_vector_norm.default, F(3, 4, 5), ord_, [0, -1])
row(aten.linalg_vector_norm.default, F(3, 4), dtype=torch.float32)
row(aten.linalg_vector_norm.default, torch.zeros(3, 4), 2, [1])
row(aten.linalg_vector_norm.default, H(3, 16), 2, [1], tol=HALF)
row(aten.norm.Scalar, F(3, 4))
row(aten.norm.Scalar, F(3, 4), 1)
row(aten.norm.ScalarOpt_dim, F(3, 4, 5), 2, [1])
row(aten.norm.ScalarOpt_dim, F(3, 4, 5), None, [0, 2], True)
row(aten.norm.ScalarOpt_dim, F(3, 4, 5), math.inf, [-1])
row(aten.norm.ScalarOpt_dim_dtype, F(3, 4), 2, [1], False, dtype=torch.float32)
row(aten.norm.ScalarOpt_dtype, F(3, 4), 3, dtype=torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# checking (the harness is tests/torch_bridge/parity.py)
# ---------------------------------------------------------------------------------------------------------------

TABLE = JitTable(ROWS)
# the table compiles once per xdist worker that runs one of its rows: keep its rows on one worker
pytestmark = pytest.mark.xdist_group("test_ops_reduction")


@pytest.mark.parametrize(("op", "args", "kwargs", "tol"), ROWS)
def test_parity(op, args, kwargs, tol):
    check_parity(op, args, kwargs, tol, TABLE)


# ---------------------------------------------------------------------------------------------------------------
# gradients: torch's tie-breaking and zero-norm conventions
# ---------------------------------------------------------------------------------------------------------------
GRAD_ROWS = [
    pytest.param(aten.max.dim, (with_ties(3, 6), 1), id="max.dim-ties"),      # whole gradient to the index
    pytest.param(aten.min.dim, (with_ties(3, 6), 0, True), id="min.dim-ties"),
    pytest.param(aten.amax.default, (with_ties(3, 6), [1]), id="amax-ties"),  # split evenly among ties
    pytest.param(aten.amin.default, (with_ties(3, 6),), id="amin-ties"),
    pytest.param(aten.max.default, (with_ties(3, 6),), id="max-ties"),
    pytest.param(aten.sum.dim_IntList, (F(3, 4), [1]), id="sum"),
    pytest.param(aten.mean.dim, (F(3, 4), [0], True), id="mean"),
    pytest.param(aten.prod.dim_int, (U(3, 4), 1), id="prod"),
    pytest.param(aten.var.correction, (F(3, 4), [1]), id="var"),
    pytest.param(aten.std.correction, (F(3, 4), None), id="std"),
    pytest.param(aten.logsumexp.default, (F(3, 4), [1]), id="logsumexp"),
    pytest.param(aten.cumsum.default, (F(3, 4), 1), id="cumsum"),
    pytest.param(aten.cumprod.default, (U(3, 4), 1), id="cumprod"),
    pytest.param(aten.linalg_vector_norm.default, (F(3, 4), 2, [1]), id="norm2"),
    pytest.param(aten.linalg_vector_norm.default, (torch.zeros(3, 4), 2, [1]), id="norm2-zero"),
    pytest.param(aten.linalg_vector_norm.default, (torch.zeros(3, 4), 3, [1]), id="norm3-zero"),
    pytest.param(aten.linalg_vector_norm.default, (F(3, 4), math.inf, [1]), id="norm-inf"),
]


@pytest.mark.parametrize(("op", "args"), GRAD_ROWS)
def test_grad_parity(op, args):
    ((got,), (want,)) = grads_against_torch(op, args, {}, [0])
    np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# coverage and call convention
# ---------------------------------------------------------------------------------------------------------------
REDUCTION_CORE = """
amax.default amin.default any.default any.dim any.dims argmax.default argmin.default cumsum.default max.dim
mean.default mean.dim min.dim prod.default prod.dim_int sum.dim_IntList var.correction var.dim
""".split()


def _mine(module):
    return {op for op in registered_ops() if lookup(op).fn.__module__ == module.__name__}


def test_core_coverage():
    core = {str(op).removeprefix("aten.") for op in core_aten_overloads()}
    assert set(REDUCTION_CORE) <= core, sorted(set(REDUCTION_CORE) - core)
    covered = {str(op).removeprefix("aten.") for op in _mine(reduction)} & core
    assert set(REDUCTION_CORE) <= covered, f"no longer lowered: {sorted(set(REDUCTION_CORE) - covered)}"


def test_every_registered_overload_has_a_parity_row():
    tested = {p.values[0] for p in ROWS}
    assert _mine(reduction) <= tested, sorted(map(str, _mine(reduction) - tested))


def test_signatures_match_schemas():
    for op in _mine(reduction):
        assert_signature_matches_schema(op)

