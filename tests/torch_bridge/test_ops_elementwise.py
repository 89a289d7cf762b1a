"""Parity of the elementwise lowerings with the ATen ops themselves: values, dtypes (torch's promotion), shapes;
every row runs eagerly and under ``jax.jit``. One table row per case."""
import inspect
import math

import numpy as np
import pytest
import torch

import torch_bridge.ops.elementwise as elementwise
from torch_bridge.ops.registry import core_aten_overloads, lookup, registered_ops
from tests.torch_bridge.parity import JitTable, check_parity, grads_against_torch

aten = torch.ops.aten

# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------
_g = torch.Generator().manual_seed(0)


def F(*s):  # noqa: N802 - float32 normal
    return torch.randn(*s, generator=_g)


def P(*s):  # noqa: N802 - positive
    return torch.rand(*s, generator=_g) * 3 + 0.1


def U(*s):  # noqa: N802 - in (-0.9, 0.9)
    return torch.rand(*s, generator=_g) * 1.8 - 0.9


def G1(*s):  # noqa: N802 - > 1
    return torch.rand(*s, generator=_g) * 3 + 1.05


def I(*s, lo=-6, hi=7):  # noqa: N802, E743 - int64
    return torch.randint(lo, hi, s, generator=_g)


def NZ(*s):  # noqa: N802 - int64 without zeros
    x = I(*s)
    return torch.where(x == 0, torch.ones_like(x), x)


def B(*s):  # noqa: N802 - bool
    return torch.rand(*s, generator=_g) > 0.5


def H(*s):  # noqa: N802 - float16
    return F(*s).half()


nan, inf = math.nan, math.inf
SPECIAL = torch.tensor([0.0, -0.0, 1.5, -2.5, nan, inf, -inf, 0.5, 2.5, -0.5, 3.5, -1.0])
HALVES = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 7.0, -3.2, 0.0])

EXACT, TRANS, HALF = (1e-6, 1e-6), (1e-5, 1e-5), (2e-3, 2e-3)  # (atol, rtol)

ROWS = []


def row(op, *args, tol=EXACT, **kwargs):
    ROWS.append(pytest.param(op, args, kwargs, tol, id=f"{op}-{len(ROWS)}"))


# ---------------------------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------------------------
# add / sub / rsub / mul, with alpha and promotion
row(aten.add.Tensor, F(3, 4), F(3, 4))
row(aten.add.Tensor, F(2, 3, 4), F(4))                     # broadcasting across ranks
row(aten.add.Tensor, F(3, 1), F(1, 4), alpha=2.5)
row(aten.add.Tensor, I(3, 4), I(3, 4), alpha=3)
row(aten.add.Tensor, I(3, 4), F(4))                        # int + float -> float
row(aten.add.Tensor, I(3, 4), torch.tensor(2.5))           # zero-dim float tensor lifts the category
row(aten.add.Tensor, F(3, 4), torch.tensor(2.5, dtype=torch.float64))  # ...but not the width
row(aten.add.Tensor, H(3, 4), torch.tensor(0.25), tol=HALF)  # float16 stays float16
row(aten.add.Tensor, B(3, 4), B(3, 4))                     # bool + bool = or
row(aten.add.Tensor, I(3, 4).to(torch.int8), torch.tensor(3))
row(aten.add.Tensor, I(3, 4, lo=0).to(torch.uint8), I(3, 4).to(torch.int8))  # -> int16
row(aten.add.Tensor, H(5), H(5), tol=HALF)
row(aten.add.Scalar, F(3, 4), 2.5)
row(aten.add.Scalar, I(3, 4), 2.5)                         # int tensor + float scalar -> float32
row(aten.add.Scalar, I(3, 4), 2, 3)
row(aten.add.Scalar, B(3, 4), 1)                           # bool + int scalar -> int64
row(aten.sub.Tensor, F(3, 4), F(3, 4))
row(aten.sub.Tensor, F(3, 4), F(3, 1), alpha=0.5)
row(aten.sub.Tensor, I(2, 3), I(3), alpha=2)
row(aten.sub.Scalar, F(3, 4), 1.5)
row(aten.sub.Scalar, I(3, 4), 1.5, 2)
row(aten.rsub.Scalar, F(3, 4), 1.0)
row(aten.rsub.Scalar, I(3, 4), 1.5, 2)
row(aten.rsub.Tensor, F(3, 4), F(4), alpha=2)
row(aten.mul.Tensor, F(3, 4), F(3, 4))
row(aten.mul.Tensor, F(2, 3, 4), F(3, 1))
row(aten.mul.Tensor, I(3, 4), I(4))
row(aten.mul.Tensor, B(3, 4), B(3, 4))
row(aten.mul.Tensor, B(3, 4), F(3, 4))
row(aten.mul.Scalar, F(3, 4), -1.5)
row(aten.mul.Scalar, I(3, 4), 0.5)
row(aten.mul.Scalar, I(3, 4), 3)

# division and friends
row(aten.div.Tensor, F(3, 4), P(3, 4))
row(aten.div.Tensor, I(3, 4), NZ(4))                       # true division of ints -> float
row(aten.div.Tensor, F(3, 4), torch.tensor([0.0, -0.0, 1.0, 2.0]))   # +-inf and nan
row(aten.div.Scalar, F(3, 4), 3.0)
row(aten.div.Scalar, I(3, 4), 4)
for mode in (None, "trunc", "floor"):
    row(aten.div.Tensor_mode, F(3, 4) * 5, F(3, 4), rounding_mode=mode)
    row(aten.div.Tensor_mode, I(3, 4) * 3, NZ(4), rounding_mode=mode)
    row(aten.div.Tensor_mode, F(2, 3) * 5, torch.tensor([0.0, -2.0, 0.75]), rounding_mode=mode)
    row(aten.div.Scalar_mode, F(3, 4) * 5, -1.5, rounding_mode=mode)
    row(aten.div.Scalar_mode, I(3, 4) * 3, -4, rounding_mode=mode)
row(aten.floor_divide.default, I(3, 4) * 3, NZ(3, 4))
row(aten.floor_divide.default, F(3, 4) * 5, F(3, 4))
row(aten.floor_divide.Scalar, F(3, 4) * 5, -0.7)
row(aten.remainder.Tensor, F(3, 4) * 5, F(3, 4))
row(aten.remainder.Tensor, I(3, 4) * 3, NZ(4))
row(aten.remainder.Tensor, F(3, 4) * 5, I(4, lo=1, hi=5))
row(aten.remainder.Scalar, F(3, 4) * 5, -1.5)
row(aten.remainder.Scalar, I(3, 4) * 3, 4)
row(aten.remainder.Scalar, I(3, 4) * 3, -4)
row(aten.remainder.Scalar_Tensor, 5, NZ(3, 4))
row(aten.fmod.Tensor, F(3, 4) * 5, F(3, 4))
row(aten.fmod.Tensor, I(3, 4) * 3, NZ(3, 4))
row(aten.fmod.Scalar, F(3, 4) * 5, -1.5)
row(aten.fmod.Scalar, I(3, 4) * 3, 4)

# pow
for e in (2, 3, 0, 1, -1, -2, 2.0, 0.5, -0.5, 1.7, -1.3):
    row(aten.pow.Tensor_Scalar, P(3, 4), e, tol=TRANS)
row(aten.pow.Tensor_Scalar, F(3, 4), 2)
row(aten.pow.Tensor_Scalar, F(3, 4), 3, tol=TRANS)
row(aten.pow.Tensor_Scalar, I(3, 4), 2)
row(aten.pow.Tensor_Scalar, I(3, 4), 3)
row(aten.pow.Tensor_Scalar, I(3, 4), 0.5, tol=TRANS)       # int ** float -> float (nan for negatives)
row(aten.pow.Tensor_Scalar, B(3, 4), 2)                    # bool -> int64
row(aten.pow.Tensor_Tensor, P(3, 4), F(3, 4), tol=TRANS)
row(aten.pow.Tensor_Tensor, P(3, 4), F(4), tol=TRANS)
row(aten.pow.Tensor_Tensor, I(3, 4), I(3, 4, lo=0, hi=5))
row(aten.pow.Tensor_Tensor, P(3, 4), I(3, 4, lo=-3, hi=4), tol=TRANS)
row(aten.pow.Scalar, 2.0, F(3, 4), tol=TRANS)
row(aten.pow.Scalar, 2, I(3, 4, lo=0, hi=10))
row(aten.pow.Scalar, 1.5, I(3, 4, lo=0, hi=10), tol=TRANS)
row(aten.square.default, F(3, 4))
row(aten.square.default, I(3, 4))
row(aten.square.default, B(3, 4))

# binary math
row(aten.maximum.default, F(3, 4), F(4))
row(aten.maximum.default, SPECIAL, SPECIAL.flip(0))
row(aten.maximum.default, I(3, 4), I(3, 4))
row(aten.maximum.default, I(3, 4), F(3, 4))
row(aten.minimum.default, F(3, 4), F(3, 1))
row(aten.minimum.default, SPECIAL, SPECIAL.flip(0))
row(aten.minimum.default, B(3, 4), B(3, 4))
row(aten.fmax.default, SPECIAL, SPECIAL.flip(0))
row(aten.fmin.default, SPECIAL, SPECIAL.flip(0))
row(aten.atan2.default, F(3, 4), F(3, 4), tol=TRANS)
row(aten.atan2.default, F(3, 4), F(4), tol=TRANS)
row(aten.atan2.default, I(3, 4), I(3, 4), tol=TRANS)
row(aten.hypot.default, F(3, 4), F(3, 4), tol=TRANS)
row(aten.copysign.Tensor, F(3, 4), F(3, 4))
row(aten.copysign.Scalar, I(3, 4), -1.0)
row(aten.logaddexp.default, F(3, 4), F(3, 4), tol=TRANS)
row(aten.lerp.Scalar, F(3, 4), F(3, 4), 0.3)
row(aten.lerp.Scalar, F(3, 4), F(4), 0.8)
row(aten.lerp.Tensor, F(3, 4), F(3, 4), torch.rand(3, 4, generator=_g))
row(aten.lerp.Tensor, F(3, 4), F(4), torch.rand(3, 1, generator=_g) * 2 - 0.5)
row(aten.addcmul.default, F(3, 4), F(3, 4), F(4), value=0.5)
row(aten.addcmul.default, I(3, 4), I(3, 4), I(3, 4), value=2)
row(aten.addcdiv.default, F(3, 4), F(3, 4), P(3, 1), value=-0.5)

# unary, int to float
_UNARY = [
    (aten.acos.default, U), (aten.acosh.default, G1), (aten.asin.default, U), (aten.asinh.default, F),
    (aten.atan.default, F), (aten.atanh.default, U), (aten.cos.default, F), (aten.cosh.default, F),
    (aten.sin.default, F), (aten.sinh.default, F), (aten.tan.default, U), (aten.erf.default, F),
    (aten.erfc.default, F), (aten.erfinv.default, U), (aten.exp.default, F), (aten.exp2.default, F),
    (aten.expm1.default, F), (aten.log.default, P), (aten.log10.default, P), (aten.log1p.default, P),
    (aten.log2.default, P), (aten.sqrt.default, P), (aten.rsqrt.default, P), (aten.reciprocal.default, F),
]
for op, make in _UNARY:
    row(op, make(3, 4), tol=TRANS)
    row(op, make(2, 3, 5), tol=TRANS)
for op in (aten.exp.default, aten.sin.default, aten.sqrt.default, aten.log.default, aten.reciprocal.default,
           aten.rsqrt.default, aten.atan.default, aten.erf.default):
    row(op, I(3, 4, lo=1), tol=TRANS)                      # int -> float32
row(aten.exp.default, B(3, 4), tol=TRANS)
row(aten.sqrt.default, F(3, 4), tol=TRANS)                 # nan for negatives
row(aten.log.default, SPECIAL, tol=TRANS)
row(aten.exp.default, H(3, 4), tol=HALF)
row(aten.reciprocal.default, SPECIAL)

# unary, dtype preserving
for x in (F(3, 4), I(3, 4), SPECIAL):
    row(aten.abs.default, x)
    row(aten.neg.default, x)
    row(aten.sign.default, x)
    row(aten.sgn.default, x)
    row(aten.signbit.default, x)
    row(aten.positive.default, x)
row(aten.sign.default, B(3, 4))
for x in (F(3, 4) * 4, I(3, 4), SPECIAL, HALVES):
    for op in (aten.ceil.default, aten.floor.default, aten.trunc.default, aten.round.default, aten.fix.default):
        row(op, x)
row(aten.round.decimals, F(3, 4) * 100, decimals=1, tol=TRANS)
row(aten.round.decimals, F(3, 4) * 1000, decimals=-2, tol=TRANS)
row(aten.frac.default, F(3, 4) * 4)
row(aten.nan_to_num.default, SPECIAL)
row(aten.nan_to_num.default, SPECIAL, 1.0, 100.0, -100.0)

# predicates, comparisons, logical, bitwise
for x in (SPECIAL, F(3, 4), I(3, 4), B(3, 4)):
    for op in (aten.isnan.default, aten.isinf.default, aten.isfinite.default, aten.isposinf.default,
               aten.isneginf.default):
        if not (x.dtype == torch.bool and op in (aten.isposinf.default, aten.isneginf.default)):
            row(op, x)
for name in ("eq", "ne", "lt", "le", "gt", "ge"):
    packet = getattr(aten, name)
    row(packet.Tensor, F(3, 4), F(3, 4))
    row(packet.Tensor, F(2, 3, 4), F(4))
    row(packet.Tensor, I(3, 4), I(3, 4))
    row(packet.Tensor, I(3, 4), F(4))
    row(packet.Tensor, B(3, 4), B(3, 4))
    row(packet.Tensor, SPECIAL, SPECIAL.flip(0))
    row(packet.Tensor, F(3, 4), torch.tensor(0.0))
    row(packet.Scalar, F(3, 4), 0.25)
    row(packet.Scalar, I(3, 4), 0.5)                       # compared as floats
    row(packet.Scalar, I(3, 4), 2)
    row(packet.Scalar, B(3, 4), True)
    row(packet.Scalar, SPECIAL, nan)
for op in (aten.logical_and.default, aten.logical_or.default, aten.logical_xor.default):
    row(op, B(3, 4), B(3, 4))
    row(op, B(2, 3, 4), B(4))
    row(op, F(3, 4).round(), I(3, 4))
    row(op, SPECIAL, SPECIAL.flip(0))
for x in (B(3, 4), I(3, 4), F(3, 4).round(), SPECIAL):
    row(aten.logical_not.default, x)
for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "__and__", "__or__", "__xor__"):
    packet = getattr(aten, name)
    row(packet.Tensor, I(3, 4), I(3, 4))
    row(packet.Tensor, I(2, 3, 4), I(4))
    row(packet.Tensor, B(3, 4), B(3, 4))
    row(packet.Tensor, B(3, 4), I(3, 4))
    row(packet.Tensor, I(3, 4).to(torch.uint8), I(3, 4).to(torch.uint8))
    row(packet.Scalar, I(3, 4), 5)
    row(packet.Scalar, I(3, 4), -3)
    row(packet.Scalar, B(3, 4), True)
for x in (I(3, 4), B(3, 4), I(3, 4).to(torch.int8), I(3, 4, lo=0).to(torch.uint8)):
    row(aten.bitwise_not.default, x)

# where, clamp, masked_fill
row(aten.where.self, B(3, 4), F(3, 4), F(3, 4))
row(aten.where.self, B(3, 1), F(4), F(3, 4))
row(aten.where.self, B(3, 4), I(3, 4), F(3, 4))
row(aten.where.self, B(3, 4), I(3, 4), I(4))
row(aten.where.self, B(2, 3, 4), F(3, 4), torch.tensor(-inf))
row(aten.where.self, B(3, 4), H(3, 4), torch.tensor(0.0), tol=HALF)
row(aten.where.ScalarSelf, B(3, 4), 1.5, F(3, 4))
row(aten.where.ScalarOther, B(3, 4), I(3, 4), 0.5)
row(aten.where.Scalar, B(3, 4), 1.0, 0.0)
row(aten.where.Scalar, B(3, 4), 1, 0)
row(aten.clamp.default, F(3, 4), -0.5, 0.5)
row(aten.clamp.default, F(3, 4), -0.5)
row(aten.clamp.default, F(3, 4), None, 0.25)
row(aten.clamp.default, F(3, 4), 0.5, -0.5)               # min > max gives max
row(aten.clamp.default, SPECIAL, -1.0, 1.0)                # nan propagates
row(aten.clamp.default, I(3, 4), -2, 3)
row(aten.clamp.default, I(3, 4), 1.5)                      # int clamped by a float -> float
row(aten.clamp.Tensor, F(3, 4), F(3, 4) - 1, F(3, 4) + 1)
row(aten.clamp.Tensor, F(3, 4), F(4))
row(aten.clamp.Tensor, F(3, 4), None, F(3, 1))
row(aten.clamp.Tensor, I(3, 4), I(4), None)
row(aten.clip.default, F(3, 4), -0.5, 0.5)
row(aten.clip.Tensor, F(3, 4), F(4), F(4) + 1)
row(aten.clamp_min.default, F(3, 4), 0.0)
row(aten.clamp_min.default, I(3, 4), 0)
row(aten.clamp_min.Tensor, F(3, 4), F(4))
row(aten.clamp_max.default, F(3, 4), 0.0)
row(aten.clamp_max.default, I(3, 4), 2)
row(aten.clamp_max.Tensor, F(3, 4), F(3, 1))
row(aten.masked_fill.Scalar, F(3, 4), B(3, 4), -inf)
row(aten.masked_fill.Scalar, F(2, 3, 4), B(3, 4), 0.5)
row(aten.masked_fill.Scalar, I(3, 4), B(4), 2.7)           # value cast to the tensor's dtype
row(aten.masked_fill.Scalar, B(3, 4), B(3, 4), True)
row(aten.masked_fill.Tensor, F(3, 4), B(3, 4), torch.tensor(-1e9))
row(aten.masked_fill.Tensor, I(3, 4), B(3, 1), torch.tensor(7))


# ---------------------------------------------------------------------------------------------------------------
# checking
# ---------------------------------------------------------------------------------------------------------------

TABLE = JitTable(ROWS)
# the table compiles once per xdist worker that runs one of its rows: keep its rows on one worker
pytestmark = pytest.mark.xdist_group("test_ops_elementwise")


@pytest.mark.parametrize(("op", "args", "kwargs", "tol"), ROWS)
def test_parity(op, args, kwargs, tol):
    check_parity(op, args, kwargs, tol, TABLE)


# ---------------------------------------------------------------------------------------------------------------
# gradients where torch's and the obvious JAX formula could disagree
# ---------------------------------------------------------------------------------------------------------------
GRAD_ROWS = [
    pytest.param(aten.clamp.default, (F(3, 4), -0.5, 0.5), {}, id="clamp"),
    pytest.param(aten.where.self, (B(3, 4), F(3, 4), F(4)), {}, id="where"),
    pytest.param(aten.div.Tensor, (F(3, 4), P(4)), {}, id="div"),
    pytest.param(aten.pow.Tensor_Scalar, (P(3, 4), 0.5), {}, id="pow-sqrt"),
    pytest.param(aten.pow.Tensor_Scalar, (F(3, 4), 3), {}, id="pow-3"),
    pytest.param(aten.pow.Tensor_Tensor, (P(3, 4), F(3, 4)), {}, id="pow-tt"),
    pytest.param(aten.maximum.default, (F(3, 4), F(3, 4)), {}, id="maximum"),
    pytest.param(aten.lerp.Tensor, (F(3, 4), F(3, 4), torch.rand(3, 4, generator=_g)), {}, id="lerp"),
    pytest.param(aten.masked_fill.Scalar, (F(3, 4), B(3, 4), 0.0), {}, id="masked_fill"),
    pytest.param(aten.rsqrt.default, (P(3, 4),), {}, id="rsqrt"),
    pytest.param(aten.atan2.default, (F(3, 4), F(3, 4)), {}, id="atan2"),
]


@pytest.mark.parametrize(("op", "args", "kwargs"), GRAD_ROWS)
def test_grad_parity(op, args, kwargs):
    """d(sum(out * w))/d(each float tensor input), torch autograd against jax.grad."""
    wrt = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    for got, want in zip(*grads_against_torch(op, args, kwargs, wrt)):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# coverage and call convention
# ---------------------------------------------------------------------------------------------------------------
ELEMENTWISE_CORE = """
abs.default acos.default acosh.default add.Scalar add.Tensor asin.default asinh.default atan.default atan2.default
atanh.default bitwise_and.Scalar bitwise_and.Tensor bitwise_not.default bitwise_or.Scalar bitwise_or.Tensor
bitwise_xor.Scalar bitwise_xor.Tensor ceil.default clamp.Tensor clamp.default cos.default cosh.default div.Scalar
div.Scalar_mode div.Tensor div.Tensor_mode eq.Scalar eq.Tensor erf.default exp.default expm1.default floor.default
fmod.Scalar fmod.Tensor ge.Scalar ge.Tensor gt.Scalar gt.Tensor isinf.default isnan.default le.Scalar le.Tensor
log.default log10.default log1p.default log2.default logical_and.default logical_not.default logical_or.default
logical_xor.default lt.Scalar lt.Tensor maximum.default minimum.default mul.Scalar mul.Tensor ne.Scalar ne.Tensor
neg.default pow.Scalar pow.Tensor_Scalar pow.Tensor_Tensor reciprocal.default remainder.Scalar remainder.Tensor
round.default rsqrt.default sign.default sin.default sinh.default sqrt.default sub.Scalar sub.Tensor tan.default
trunc.default where.self
""".split()


def _mine(module):
    return {op for op in registered_ops() if lookup(op).fn.__module__ == module.__name__}


def test_core_coverage():
    core = {str(op).removeprefix("aten.") for op in core_aten_overloads()}
    assert set(ELEMENTWISE_CORE) <= core, sorted(set(ELEMENTWISE_CORE) - core)
    covered = {str(op).removeprefix("aten.") for op in _mine(elementwise)} & core
    assert set(ELEMENTWISE_CORE) <= covered, f"no longer lowered: {sorted(set(ELEMENTWISE_CORE) - covered)}"
    tested = {str(p.values[0]).removeprefix("aten.") for p in ROWS}
    assert covered <= tested, f"lowered but without a parity row: {sorted(covered - tested)}"


def test_every_registered_overload_has_a_parity_row():
    tested = {p.values[0] for p in ROWS}
    assert _mine(elementwise) <= tested, sorted(map(str, _mine(elementwise) - tested))


def check_signatures(module):
    """Each lowering accepts its schema: positional arguments in schema order, keyword-only ones by name."""
    for op in _mine(module):
        params = inspect.signature(lookup(op).fn).parameters
        names = list(params)
        schema = op._schema.arguments
        positional = [a.name for a in schema if not a.kwarg_only]
        assert names[:len(positional)] == positional, f"{op}: {names} vs schema {positional}"
        for a in schema:
            assert a.name in params, f"{op}: no parameter {a.name}"
        required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
        schema_required = {a.name for a in schema if not a.has_default_value()}
        assert set(required) <= schema_required, f"{op}: {required} required, schema requires {schema_required}"


def test_signatures_match_schemas():
    check_signatures(elementwise)
