"""Parity of torch_bridge/ops/nn_extra.py (weight norm, 3-D pools, embedding bags, cdist) with the ATen ops
themselves: values, dtypes and shapes under one ``jax.jit`` and eagerly, gradients against torch autograd, and whole
modules bridged with ``from_torch`` (a weight-normed Wav2Vec2-style positional conv, an ``nn.EmbeddingBag`` text
classifier, a 3-D conv net) against torch: forward and every parameter's gradient."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge.ops.nn_extra as extra_ops
from tests.torch_bridge.parity import (LAYER_TOL, MODEL_TOL, JitTable, assert_close_on_scale,
                                      assert_signature_matches_schema, check_parity, grads_against_torch,
                                      to_jax)
from torch_bridge import from_torch
from torch_bridge.ops.registry import lookup, registered_ops

aten = torch.ops.aten
_g = torch.Generator().manual_seed(0)
LOOSE = (1e-5, 1e-5)


def F32(*s):  # noqa: N802 - float32 normal
    return torch.randn(s, generator=_g)


def TIES(*s):  # noqa: N802 - small integers as floats: many ties inside a window
    return torch.randint(-2, 3, s, generator=_g).float()


def IDX(*s, n=10):  # noqa: N802 - int64 indices in [0, n)
    return torch.randint(0, n, s, generator=_g)


ROWS = []


def row(op, *args, tol=LOOSE, **kwargs):
    ROWS.append(pytest.param(op, args, kwargs, tol, id=f"{op}-{len(ROWS)}"))


# ---------------------------------------------------------------------------------------------------------------
# value rows
# ---------------------------------------------------------------------------------------------------------------
wn, wni = aten._weight_norm.default, aten._weight_norm_interface.default
v3 = F32(6, 4, 5)
for dim, gshape in ((0, (6, 1, 1)), (1, (1, 4, 1)), (2, (1, 1, 5)), (-1, ()), (-2, (1, 4, 1)), (-3, (6, 1, 1))):
    row(wn, v3, torch.rand(gshape, generator=_g) + 0.5, dim)
row(wn, v3, torch.rand(6, generator=_g) + 0.5, 0)            # g flat, read as (6, 1, 1)
row(wn, F32(5, 3), torch.rand(5, 1, generator=_g) + 0.5)     # nn.Linear's default dim=0
row(wni, v3, torch.rand(6, 1, 1, generator=_g) + 0.5, 0)
row(wni, v3, torch.rand(1, 1, 5, generator=_g) + 0.5, 2)

x5 = F32(2, 3, 6, 7, 5)
for op in (aten.max_pool3d.default, aten.max_pool3d_with_indices.default):
    row(op, x5, [2, 2, 2])
    row(op, x5, [3, 2, 2], [2, 1, 2], [1, 0, 1], [1, 1, 1], True)       # ceil_mode, padding
    row(op, x5, [2, 2, 2], [1, 2, 1], [0, 1, 0], [2, 1, 2])              # dilation
    row(op, F32(3, 5, 4, 6), [2, 3, 2], [2, 2, 2], [1, 1, 0], [1, 1, 1], True)  # unbatched (C, D, H, W)
    row(op, TIES(2, 2, 4, 4, 4), [2, 2, 2])                              # ties: torch's first index
ap3 = aten.avg_pool3d.default
row(ap3, x5, [2, 2, 2])
row(ap3, x5, [3, 2, 3], [2, 2, 1], [1, 1, 1], True, True)
row(ap3, x5, [3, 2, 3], [2, 2, 1], [1, 1, 1], True, False)                # count_include_pad=False
row(ap3, x5, [3, 3, 2], [2, 2, 2], [1, 0, 1], False, True, 5)             # divisor_override
row(ap3, F32(3, 5, 4, 6), [2, 2, 2], [], [0, 1, 0], True, False)        # unbatched
for op in (aten.adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d.default):
    row(op, x5, [2, 3, 1])
    row(op, x5, [4, 5, 3])                                               # overlapping bins
    row(op, x5, [1, 1, 1])
amp3 = aten.adaptive_max_pool3d.default
row(amp3, x5, [4, 5, 3])                                                # overlapping bins
row(amp3, TIES(2, 2, 5, 6, 7), [3, 4, 2])                               # ties: torch's first index
row(amp3, F32(3, 5, 4, 6), [6, 4, 5])                                   # unbatched, bins wider than the input

eb, ebf = aten._embedding_bag.default, aten._embedding_bag_forward_only.default
ebd, ebp = aten.embedding_bag.default, aten.embedding_bag.padding_idx
W10 = F32(10, 4)
bag_idx = torch.tensor([1, 2, 0, 4, 5, 0, 0, 7, 3, 3])
bag_off = torch.tensor([0, 2, 2, 5])                       # bag 1 empty
bag_off_last = torch.tensor([0, 2, 2, 5, 10])
bag_off_short = torch.tensor([0, 2, 2, 5, 8])              # last offset before the end: torch's per-mode quirk
psw = torch.rand(10, generator=_g) + 0.5
for mode in (0, 1):  # sum, mean: every path of offsets, padding and the include_last_offset quirks
    row(eb, W10, bag_idx, bag_off, False, mode, False, None, False, -1)
    row(eb, W10, bag_idx, bag_off_last, False, mode, False, None, True, 0)
    row(eb, W10, bag_idx, bag_off_short, False, mode, False, None, True, -1)
    row(eb, W10, bag_idx, bag_off_short, False, mode, False, None, True, 0)
row(eb, W10, bag_idx, bag_off, False, 2, False, None, False, -1)              # max
row(eb, W10, bag_idx, bag_off_short, False, 2, False, None, True, 0)
row(eb, W10, bag_idx, bag_off, False, 0, False, psw, False, -1)               # per_sample_weights
row(eb, W10, bag_idx, bag_off_last, False, 0, False, psw, True, 0)
row(eb, W10, torch.tensor([0, 0, 3, 0]), torch.tensor([0, 2]), False, 2, False, None, False, 0)  # all padding
row(eb, W10, torch.tensor([0, 0, 3, 0]), torch.tensor([0, 2]), False, 1, False, None, False, 0)
row(eb, W10, TIES(12).long().abs(), torch.tensor([0, 4, 9]), False, 2, False, None, False, -1)  # ties: first
for mode in (0, 2):
    row(eb, W10, torch.zeros(0, dtype=torch.long), torch.tensor([0, 0]), False, mode, False, None, False, 0)  # none
for args in ((bag_off_last, False, 0, False, None, True, -1), (bag_off_short, False, 0, False, None, True, 0),
             (bag_off, False, 1, False, None, False, 0), (bag_off_last, False, 2, False, None, True, -1),
             (bag_off, False, 0, False, psw, False, 3)):
    row(ebf, W10, bag_idx, *args)  # only the sizes of the auxiliary outputs differ from _embedding_bag
for mode in (0, 1, 2):
    row(ebd, W10, bag_idx, bag_off, False, mode)
    row(ebp, W10, bag_idx, bag_off_last, False, mode, False, None, True, 0)
row(ebp, W10, bag_idx, bag_off, False, 0, False, psw, False, None)
row(ebd, W10, IDX(12), torch.arange(0, 12, 3), False, 1)                 # what 2-D (4, 3) input becomes

cd, cdf, ed = aten.cdist.default, aten._cdist_forward.default, aten._euclidean_dist.default
a, b = F32(2, 5, 3), F32(2, 4, 3)
for p in (2.0, 1.0, float("inf"), 3.0, 0.5, 0.0):
    row(cd, a, b, p)
    row(cdf, a, b, p, None)
big_a, big_b = F32(30, 4), F32(7, 4)  # > 25 rows: torch's default picks the matmul for p = 2
for mode in (None, 0, 1, 2):
    row(cd, big_a, big_b, 2.0, mode)
    row(cdf, a, b, 2.0, mode)
row(cd, F32(3, 1, 4, 2), F32(5, 6, 2))                                   # broadcast batch dims
row(cd, F32(4, 3), F32(6, 3), 1.5)
row(ed, a, b)
pdist = aten._pdist_forward.default
twins = F32(6, 4)
twins[3] = twins[1]  # a distance of exactly 0
for p in (2.0, 1.0, float("inf"), 0.5):
    row(pdist, twins, p)

# reflection/replication pads live in nn_pool (beside aten.pad); their rows are here, with the other 3-D shapes
PADS = [(f"{kind}_pad{nd}d", (2, 3, 5, 6, 7)[-(nd + 1):], [1, 2, 0, 1, 2, 1][:2 * nd])
        for kind in ("reflection", "replication") for nd in (1, 2, 3)]
for name, shape, pads in PADS:
    row(getattr(aten, name).default, F32(*shape), pads)


TABLE = JitTable(ROWS)
pytestmark = pytest.mark.xdist_group("test_ops_extra")


@pytest.mark.parametrize(("op", "args", "kwargs", "tol"), ROWS)
def test_parity(op, args, kwargs, tol):
    check_parity(op, args, kwargs, tol, TABLE)


# ---------------------------------------------------------------------------------------------------------------
# gradients: jax.grad of the lowering against torch autograd, at the per-op tolerance
# ---------------------------------------------------------------------------------------------------------------
GRAD_ROWS = []


def grad_row(name, op, *args, wrt=(0,), **kwargs):
    GRAD_ROWS.append(pytest.param(op, args, kwargs, list(wrt), id=f"{name}-{len(GRAD_ROWS)}"))


for dim, gshape in ((0, (6, 1, 1)), (2, (1, 1, 5)), (-1, ()), (1, (1, 4, 1))):
    grad_row(f"weight_norm-dim{dim}", wn, v3, torch.rand(gshape, generator=_g) + 0.5, dim, wrt=(0, 1))
grad_row("weight_norm_interface", wni, v3, torch.rand(1, 1, 5, generator=_g) + 0.5, 2, wrt=(0, 1))
grad_row("max_pool3d", aten.max_pool3d.default, x5, [3, 2, 2], [2, 1, 2], [1, 0, 1], [1, 1, 1], True)
grad_row("max_pool3d_with_indices", aten.max_pool3d_with_indices.default, x5, [2, 2, 2], [1, 2, 1], [0, 1, 0],
         [2, 1, 2])
grad_row("avg_pool3d", ap3, x5, [3, 2, 3], [2, 2, 1], [1, 1, 1], True, False)
grad_row("avg_pool3d-divisor", ap3, x5, [3, 3, 2], [2, 2, 2], [1, 0, 1], False, True, 5)
grad_row("adaptive_avg_pool3d", aten.adaptive_avg_pool3d.default, x5, [4, 5, 3])
grad_row("_adaptive_avg_pool3d", aten._adaptive_avg_pool3d.default, x5, [1, 1, 1])
grad_row("adaptive_max_pool3d", amp3, x5, [4, 5, 3])
for mode in (0, 1, 2):
    grad_row(f"_embedding_bag-mode{mode}", eb, W10, bag_idx, bag_off, False, mode, False, None, False, 0)
    grad_row(f"_embedding_bag-last-mode{mode}", eb, W10, bag_idx, bag_off_last, False, mode, False, None, True, -1)
    grad_row(f"embedding_bag-mode{mode}", ebd, W10, bag_idx, bag_off, False, mode)
    grad_row(f"embedding_bag.padding_idx-mode{mode}", ebp, W10, bag_idx, bag_off_short, False, mode, False, None,
             True, 0)
grad_row("_embedding_bag-psw", eb, W10, bag_idx, bag_off, False, 0, False, psw, False, 0, wrt=(0, 6))
zero_a = F32(2, 5, 3)
zero_b = torch.cat([zero_a[:, 1:3], F32(2, 2, 3)], 1)   # distances of exactly 0: torch's gradient there is 0
zero_a[:, 4, 0] = zero_b[:, 3, 0]                       # one coordinate difference of exactly 0
for p in (2.0, 1.0, float("inf"), 3.0, 0.5, 1.5, 0.0):
    grad_row(f"cdist-p{p}", cd, zero_a, zero_b, p, wrt=(0, 1))
grad_row("cdist-inf-ties", cd, TIES(2, 4, 3), TIES(2, 5, 3), float("inf"), wrt=(0, 1))
grad_row("cdist-mm", cd, big_a, big_b, 2.0, None, wrt=(0, 1))
grad_row("cdist-mm-forced", cd, F32(2, 5, 3), F32(2, 4, 3), 2.0, 1, wrt=(0, 1))
grad_row("cdist-broadcast", cd, F32(3, 1, 4, 2), F32(5, 6, 2), 2.0, wrt=(0, 1))
grad_row("_cdist_forward", cdf, zero_a, zero_b, 2.0, 2, wrt=(0, 1))
grad_row("_euclidean_dist", ed, F32(2, 5, 3), F32(2, 4, 3), wrt=(0, 1))
for p in (2.0, 1.0, float("inf"), 0.5):
    grad_row(f"pdist-p{p}", pdist, twins, p)
for name, shape, pads in PADS:
    grad_row(name, getattr(aten, name).default, F32(*shape), pads)


@functools.cache
def _all_grads():
    """``[(jax_grads, torch_grads)]`` per gradient row, as ``grads_against_torch`` computes them, but with every
    row's ``jax.grad`` inside one ``jax.jit`` (a jit per row would cost an XLA compile each)."""
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out
    torch_grads, jax_inputs = [], []
    for p in GRAD_ROWS:
        op, args, kwargs, wrt = p.values
        targs = [a.detach().clone().requires_grad_(i in wrt) if isinstance(a, torch.Tensor) else a
                 for i, a in enumerate(args)]
        out = first(op(*targs, **kwargs))
        w = torch.rand(out.shape, generator=torch.Generator().manual_seed(0)) + 0.5
        torch_grads.append(torch.autograd.grad((out * w).sum(), [targs[i] for i in wrt]))
        jargs = list(to_jax(tuple(args)))
        jax_inputs.append(([jargs[i] for i in wrt], [a for a in jargs if isinstance(a, jax.Array)],
                           to_jax(w)))

    def every_row(inputs):
        grads = []
        for p, (diff, arrays, w) in zip(GRAD_ROWS, inputs):
            op, args, kwargs, wrt = p.values
            static = to_jax(tuple(args))

            def weighted_sum(diff, arrays=arrays, static=static, op=op, wrt=wrt, kwargs=kwargs, w=w):
                it = iter(arrays)
                a = [next(it) if isinstance(v, jax.Array) else v for v in static]
                for i, d in zip(wrt, diff):
                    a[i] = d
                return jnp.sum(first(lookup(op).fn(*a, **to_jax(kwargs))) * w)

            grads.append(jax.grad(weighted_sum)(diff))
        return grads

    return list(zip(jax.jit(every_row)(jax_inputs), torch_grads))


@pytest.mark.parametrize("i", range(len(GRAD_ROWS)), ids=[p.id for p in GRAD_ROWS])
def test_grad_parity(i):
    wrt = GRAD_ROWS[i].values[3]
    got, want = _all_grads()[i]
    for j, g, w in zip(wrt, got, want):
        assert bool(jnp.isfinite(g).all()) == bool(torch.isfinite(w).all()), f"arg {j}: NaN/inf where torch has none"
        assert_close_on_scale(g, w, LAYER_TOL, f"d/d(arg {j})")


def test_grad_table_matches_the_shared_harness():
    """The one-jit gradient table computes what ``grads_against_torch`` does (checked on one row)."""
    op, args, kwargs, wrt = GRAD_ROWS[0].values
    got, want = grads_against_torch(op, args, kwargs, wrt)
    mine, theirs = _all_grads()[0]
    for g, m in zip(got, mine):
        np.testing.assert_allclose(np.asarray(g), np.asarray(m), rtol=1e-6, atol=1e-7)
    for w, t in zip(want, theirs):
        torch.testing.assert_close(w, t, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------
# whole modules: from_torch against torch, forward and every parameter's gradient
# ---------------------------------------------------------------------------------------------------------------
class PositionalConv(nn.Module):
    """Wav2Vec2's positional conv (grouped ``Conv1d`` weight-normed over its kernel dim, parametrizations API) and a
    weight-normed ``nn.Linear`` (the older hook API, default dim=0) and one normalized as a whole (dim=None)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight",
                                                          dim=2)
        self.proj = nn.utils.weight_norm(nn.Linear(8, 6))
        self.head = nn.utils.weight_norm(nn.Linear(6, 3), dim=None)

    def forward(self, x):  # x: (B, T, C)
        h = x + F.gelu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return self.head(torch.tanh(self.proj(h)))


class TextClassifier(nn.Module):
    """The torchtext tutorial's classifier, fed (flat token ids, bag offsets), with a bag per mode: a sum bag with a
    padding token and learned per-token weights, a mean bag, a max bag with include_last_offset, and a max bag over
    2-D input (fixed-length windows, no offsets: F.embedding_bag makes the offsets in the graph)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate = nn.Embedding(40, 1)
        self.sum_bag = nn.EmbeddingBag(40, 8, mode="sum", padding_idx=0)
        self.mean_bag = nn.EmbeddingBag(40, 8, mode="mean")
        self.max_bag = nn.EmbeddingBag(40, 8, mode="max", include_last_offset=True)
        self.window_bag = nn.EmbeddingBag(40, 8, mode="max")
        self.fc = nn.Linear(32, 4)

    def forward(self, text, offsets):
        last = torch.cat([offsets, offsets.new_full((1,), text.shape[0])])
        weights = torch.sigmoid(self.gate(text))[:, 0]
        windows = self.window_bag(text[:15].view(offsets.shape[0], -1))  # (5, 3) token windows: one per bag
        h = torch.cat([self.sum_bag(text, offsets, per_sample_weights=weights), self.mean_bag(text, offsets),
                       self.max_bag(text, last), windows], 1)
        return self.fc(h)


class Conv3dNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = nn.Conv3d(2, 4, 3, padding=1)
        self.pool = nn.MaxPool3d(2)
        self.c2 = nn.Conv3d(4, 6, 3, padding=1)
        self.avg = nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        self.gap = nn.AdaptiveAvgPool3d(1)
        self.gmp = nn.AdaptiveMaxPool3d((2, 1, 1))
        self.fc = nn.Linear(6 * 3, 5)

    def forward(self, x):
        h = self.pool(F.relu(self.c1(x)))
        h = self.avg(F.relu(self.c2(h)))
        return self.fc(torch.cat([self.gap(h).flatten(1), self.gmp(h).flatten(1)], 1))


_text = torch.randint(1, 40, (17,), generator=_g)
_text[[2, 9]] = 0  # padding tokens
MODULES = {  # name: (module, inputs, this file's overloads torch.export emits for it after run_decompositions)
    "weight_norm_conv": (PositionalConv, (F32(2, 9, 8),), {wn}),  # both weight-norm APIs: _weight_norm
    "embedding_bag": (TextClassifier, (_text, torch.tensor([0, 3, 3, 8, 12])), {ebp}),  # an empty bag
    "conv3d": (Conv3dNet, (F32(2, 2, 8, 8, 8),), {aten.max_pool3d.default, ap3, aten.adaptive_avg_pool3d.default,
                                                   amp3}),
}


@pytest.mark.filterwarnings("ignore:`torch.nn.utils.weight_norm` is deprecated:FutureWarning")  # used on purpose
@pytest.mark.parametrize("name", list(MODULES))
def test_module_parity(name):
    build, inputs, emitted = MODULES[name]
    module = build()
    bm = from_torch(module, inputs, dynamic_batch=False, modes=(True,))  # no layer here differs in eval
    targets = {n.target for prog in bm._programs.values() for n in prog.graph.nodes if n.op == "call_function"}
    assert targets & _mine() == emitted, sorted(map(str, targets))
    out = module(*inputs)
    w = torch.rand(out.shape, generator=torch.Generator().manual_seed(1)) + 0.5
    module.zero_grad()
    (out * w).sum().backward()
    want_grads = {k: p.grad for k, p in module.named_parameters()}

    def loss(params):
        got, _ = bm.apply(params, bm.buffers, None, *(x.numpy() for x in inputs), train=True)
        return jnp.sum(got * jnp.asarray(w.numpy())), got

    (_, got), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(bm.params)
    assert_close_on_scale(got, out, MODEL_TOL, f"{name} forward")
    assert set(grads) == set(want_grads)
    for k, g in grads.items():
        assert_close_on_scale(g, want_grads[k], MODEL_TOL, f"{name} d/d{k}")


# ---------------------------------------------------------------------------------------------------------------
# coverage and call convention
# ---------------------------------------------------------------------------------------------------------------
EXTRA_OPS = """
_weight_norm.default _weight_norm_interface.default max_pool3d.default max_pool3d_with_indices.default
avg_pool3d.default adaptive_avg_pool3d.default _adaptive_avg_pool3d.default adaptive_max_pool3d.default
_embedding_bag.default _embedding_bag_forward_only.default embedding_bag.default embedding_bag.padding_idx
cdist.default _cdist_forward.default _euclidean_dist.default _pdist_forward.default
""".split()


def _mine():
    return {op for op in registered_ops() if lookup(op).fn.__module__ == extra_ops.__name__}


def test_lowered_ops():
    assert sorted(str(op).removeprefix("aten.") for op in _mine()) == sorted(EXTRA_OPS)


def test_every_registered_overload_has_a_parity_and_grad_row():
    assert _mine() <= {p.values[0] for p in ROWS}
    # torch has no autograd formula for _embedding_bag_forward_only (it is _embedding_bag's function here)
    assert _mine() - {ebf} <= {p.values[0] for p in GRAD_ROWS}


def test_signatures_match_schemas():
    for op in _mine():
        assert_signature_matches_schema(op)


def test_unsupported_arguments_raise():
    w, i, o = jnp.ones((5, 3)), jnp.array([1, 2, 3]), jnp.array([0, 1])
    with pytest.raises(NotImplementedError, match="scale_grad_by_freq"):
        lookup(eb).fn(w, i, o, True)
    with pytest.raises(NotImplementedError, match="2-D indices"):
        lookup(eb).fn(w, i.reshape(1, 3), o)
    with pytest.raises(NotImplementedError, match="per_sample_weights"):
        lookup(eb).fn(w, i, o, False, 1, False, jnp.ones(3))
    with pytest.raises(NotImplementedError, match="compute_mode=3"):
        lookup(cd).fn(jnp.ones((2, 3)), jnp.ones((4, 3)), 2.0, 3)
