"""Parity for torch_bridge/ops/nn_recurrent.py: ``aten.lstm/gru/rnn_tanh/rnn_relu.input`` against the ATen ops
themselves (values eagerly and under jit, gradients w.r.t. input, initial states and every weight), the scan
structure of the lowering (one ``scan`` per layer and direction, a program that does not grow with the sequence
length), inter-layer dropout, and whole ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` modules converted with ``from_torch``."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn

import torch_bridge  # noqa: F401  registers the ops
from torch_bridge import from_torch
from torch_bridge.ops.registry import lookup, supported
from tests.jaxprs import equations
from tests.torch_bridge.parity import (LAYER_TOL, MODEL_TOL, JitTable, assert_close_on_scale,
                                      assert_signature_matches_schema, check_parity, to_jax)

A = torch.ops.aten
T, B, I, H = 7, 3, 4, 5
TOL = (LAYER_TOL, LAYER_TOL)
OPS = {"lstm": A.lstm.input, "gru": A.gru.input, "rnn_tanh": A.rnn_tanh.input, "rnn_relu": A.rnn_relu.input}
_MODULE = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN, "rnn_relu": nn.RNN}
_SEED = iter(range(10_000))


def randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(next(_SEED)))


def op_args(kind, *, layers=1, bidirectional=False, batch_first=False, bias=True, proj=0, dropout=0.0,
            train=False, t=T, zero_state=False):
    """The ATen op's positional arguments as ``nn.<RNN>`` hands them over: its flat weights (torch's init, so the
    layout is the module's own), random input and initial states (zeros when the module builds them)."""
    kw = dict(num_layers=layers, bidirectional=bidirectional, bias=bias)
    if kind.startswith("rnn"):
        kw["nonlinearity"] = kind[4:]
    if proj:
        kw["proj_size"] = proj
    torch.manual_seed(next(_SEED))
    m = _MODULE[kind](I, H, **kw)
    params = [p.detach().clone() for p in m._flat_weights]
    d = 2 if bidirectional else 1
    x = randn(B, t, I) if batch_first else randn(t, B, I)
    state = (lambda *s: torch.zeros(*s)) if zero_state else randn
    h0 = state(layers * d, B, proj or H)
    hx = [h0, state(layers * d, B, H)] if kind == "lstm" else h0
    return (x, hx, params, bias, layers, dropout, train, bidirectional, batch_first)


ROWS = []


def row(kind, name, **kw):
    ROWS.append(pytest.param(OPS[kind], op_args(kind, **kw), {}, TOL, id=f"{kind}-{name}"))


for kind in OPS:
    row(kind, "1layer")
    row(kind, "2layer-bidir-batch_first", layers=2, bidirectional=True, batch_first=True)
    row(kind, "nobias-zero_state", bias=False, zero_state=True)
row("lstm", "3layer-bidir", layers=3, bidirectional=True)
row("lstm", "proj", proj=3)
row("lstm", "proj-nobias-2layer-bidir-batch_first", proj=2, bias=False, layers=2, bidirectional=True,
    batch_first=True)
row("gru", "bidir", bidirectional=True)
row("rnn_tanh", "2layer", layers=2)
row("lstm", "dropout-eval", layers=2, dropout=0.5)  # dropout only in train mode
row("gru", "train-no-dropout", layers=2, train=True)
# p = 1 in train mode zeroes the next layer's input: deterministic, so comparable with torch's own dropout
row("lstm", "train-dropout1", layers=2, bidirectional=True, dropout=1.0, train=True)
row("rnn_relu", "train-dropout1", layers=2, dropout=1.0, train=True)
row("lstm", "T1", t=1, layers=2, bidirectional=True)

TABLE = JitTable(ROWS)
pytestmark = pytest.mark.xdist_group("test_ops_recurrent")


@pytest.mark.parametrize(("op", "args", "kwargs", "tol"), ROWS)
def test_parity(op, args, kwargs, tol):
    check_parity(op, args, kwargs, tol, TABLE)


@pytest.mark.parametrize("op", list(OPS.values()))
def test_signature_matches_schema(op):
    assert_signature_matches_schema(op)
    assert lookup(op).random  # inter-layer dropout draws from the node's key


def test_packed_sequences_are_not_lowered():
    """The ``.data`` overloads are left out, so a graph holding one fails at conversion with UnsupportedOpError."""
    for name in OPS:
        assert not supported(getattr(torch.ops.aten, name).data)


# ---------------------------------------------------------------------------------------------------------------
# gradients w.r.t. the input, the initial states and every weight: all rows under one jit
# ---------------------------------------------------------------------------------------------------------------
GRAD_ROWS = {
    "lstm-2layer-bidir-batch_first": ("lstm", dict(layers=2, bidirectional=True, batch_first=True)),
    "lstm-proj-nobias-bidir": ("lstm", dict(proj=3, bias=False, bidirectional=True, layers=2)),
    "gru-2layer-bidir": ("gru", dict(layers=2, bidirectional=True, train=True)),
    "gru-nobias-batch_first": ("gru", dict(bias=False, batch_first=True)),
    "rnn_tanh-2layer-bidir": ("rnn_tanh", dict(layers=2, bidirectional=True)),
    "rnn_relu-batch_first": ("rnn_relu", dict(batch_first=True, layers=2)),
}
GRAD_ARGS = {name: (OPS[kind], op_args(kind, **kw)) for name, (kind, kw) in GRAD_ROWS.items()}


def _weights(out):
    """Fixed random weights for each output, so every element of every output counts."""
    g = torch.Generator().manual_seed(1)
    return [torch.rand(o.shape, generator=g) + 0.5 for o in out]


@functools.cache
def _jax_grads():
    """{row: (d_input, d_hx, d_params)} of ``sum_k sum(out_k * w_k)`` over all outputs, every row in one jit."""
    fns, diffs, ws, statics = {}, {}, {}, {}
    for name, (op, args) in GRAD_ARGS.items():
        with torch.no_grad():
            ws[name] = [to_jax(w) for w in _weights(op(*args))]
        diffs[name] = to_jax(tuple(args[:3]))
        statics[name] = args[3:]
        fns[name] = lookup(op).fn

    def weighted_sum(d, name):
        return sum(jnp.sum(o * w) for o, w in zip(fns[name](*d, *statics[name]), ws[name]))

    def grads(diffs):
        return {name: jax.grad(weighted_sum)(d, name) for name, d in diffs.items()}

    return jax.jit(grads)(diffs)


@pytest.mark.parametrize("name", list(GRAD_ROWS))
def test_grad_parity(name):
    op, args = GRAD_ARGS[name]
    x = args[0].detach().clone().requires_grad_()
    hx = [h.detach().clone().requires_grad_() for h in args[1]] if isinstance(args[1], list) else \
        args[1].detach().clone().requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in args[2]]
    out = op(x, hx, params, *args[3:])
    loss = sum((o * w).sum() for o, w in zip(out, _weights(out)))
    hx_list = hx if isinstance(hx, list) else [hx]
    want = torch.autograd.grad(loss, [x, *hx_list, *params])
    gx, ghx, gparams = _jax_grads()[name]
    got = [gx, *(ghx if isinstance(ghx, (list, tuple)) else [ghx]), *gparams]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close_on_scale(g, w, LAYER_TOL, f"{name} grad {i}")


# ---------------------------------------------------------------------------------------------------------------
# the lowering is one scan per layer and direction, and its program does not grow with the sequence length
# ---------------------------------------------------------------------------------------------------------------
def _count(jaxpr, prim=None):
    return sum(prim is None or eqn.primitive.name == prim for eqn in equations(jaxpr))


@pytest.mark.parametrize("kind,layers,bidirectional", [("lstm", 2, True), ("gru", 3, False), ("rnn_tanh", 1, True)])
def test_one_scan_per_layer_and_direction(kind, layers, bidirectional):
    sizes = []
    for t in (5, 50):
        args = op_args(kind, layers=layers, bidirectional=bidirectional, batch_first=True, t=t)
        jargs = to_jax(tuple(args[:3]))
        jaxpr = jax.make_jaxpr(lambda *a: lookup(OPS[kind]).fn(*a, *args[3:]))(*jargs).jaxpr
        assert _count(jaxpr, "scan") == layers * (2 if bidirectional else 1)
        sizes.append(_count(jaxpr))
    assert sizes[0] == sizes[1], f"program grows with T: {sizes[0]} eqns at T=5, {sizes[1]} at T=50"


# ---------------------------------------------------------------------------------------------------------------
# inter-layer dropout in train mode: random, so checked against its definition rather than torch's masks
# ---------------------------------------------------------------------------------------------------------------
def test_inter_layer_dropout():
    p = 0.4
    x, (h0, c0), params, *_ = op_args("lstm", layers=2, bidirectional=True, dropout=p, train=True)
    fn = lookup(A.lstm.input).fn
    xj, hj, cj, pj = to_jax((x, h0, c0, params))

    @jax.jit
    def run(key):
        return fn(xj, [hj, cj], pj, True, 2, p, True, True, False, key=key)

    k1, k2 = jax.random.key(0), jax.random.key(1)
    out1, out2, again = run(k1), run(k2), run(k1)
    for a, b in zip(out1, again):
        np.testing.assert_array_equal(a, b)  # the same key replays the same masks
    assert not np.allclose(out1[0], out2[0])
    with pytest.raises(ValueError, match="PRNG key"):
        fn(xj, [hj, cj], pj, True, 2, p, True, True, False, key=None)

    # the definition: layer 2 reads layer 1's (both directions') output with entries dropped or scaled by 1/(1-p)
    first = fn(xj, [hj[:2], cj[:2]], pj[:8], True, 1, 0.0, False, True, False)
    keep = jax.random.bernoulli(jax.random.fold_in(k1, 1), 1.0 - p, first[0].shape)  # the lowering's mask
    masked = jnp.where(keep, first[0] / (1.0 - p), 0)
    second = fn(masked, [hj[2:], cj[2:]], pj[8:], True, 1, 0.0, False, True, False)
    assert 0.3 < 1.0 - float(keep.mean()) < 0.5
    np.testing.assert_allclose(out1[0], second[0], atol=1e-6)
    np.testing.assert_allclose(out1[1], jnp.concatenate([first[1], second[1]]), atol=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# whole modules through from_torch: forward and parameter gradients against torch
# ---------------------------------------------------------------------------------------------------------------
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(I, 6)
        self.rnn = nn.LSTM(6, H, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * H, 3)

    def forward(self, x):
        out, (h, c) = self.rnn(torch.relu(self.embed(x)))
        return self.head(out[:, -1] + out.mean(1)) + h.sum(0).sum(-1, keepdim=True) + c.mean()


class GRUWithState(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(I, H, num_layers=2)

    def forward(self, x, h0):
        return self.rnn(x, h0)


class UnbatchedRNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(I, H, nonlinearity="relu", bidirectional=True)

    def forward(self, x):
        return self.rnn(x)


MODULES = {
    "lstm-classifier": (Classifier, lambda: (randn(B, T, I),)),
    "gru-with-state": (GRUWithState, lambda: (randn(T, B, I), randn(2, B, H))),
    "rnn-unbatched": (UnbatchedRNN, lambda: (randn(T, I),)),
}


@pytest.mark.parametrize("name", list(MODULES))
@pytest.mark.parametrize("train", [True, False])
def test_module_parity(name, train):
    """Outputs and the gradients of ``sum(out * w)`` w.r.t. every parameter (and input) equal torch's."""
    cls, make_inputs = MODULES[name]
    torch.manual_seed(0)
    module = cls()
    inputs = make_inputs()
    bm = from_torch(module, inputs, dynamic_batch=False)
    module.train(train)
    tin = [x.clone().requires_grad_() for x in inputs]
    ref = module(*tin)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    ws = _weights(ref)
    loss = sum((o * w).sum() for o, w in zip(ref, ws))
    names = list(bm.params)
    torch_params = dict(module.named_parameters())
    want = torch.autograd.grad(loss, [torch_params[k] for k in names] + tin)

    def jax_loss(params, xs):
        out, _ = bm.apply(params, bm.buffers, jax.random.key(0), *xs, train=train)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return sum(jnp.sum(o * jnp.asarray(w.numpy())) for o, w in zip(out, ws)), out

    xs = [jnp.asarray(x.numpy()) for x in inputs]
    (_, out), (gp, gx) = jax.jit(jax.value_and_grad(jax_loss, argnums=(0, 1), has_aux=True))(bm.params, xs)
    assert len(out) == len(ref)
    for i, (o, r) in enumerate(zip(out, ref)):
        assert_close_on_scale(o, r, MODEL_TOL, f"output {i}")
    for k, w in zip(names, want):
        assert_close_on_scale(gp[k], w, MODEL_TOL, f"d/d {k}")
    for i, (g, w) in enumerate(zip(gx, want[len(names):])):
        assert_close_on_scale(g, w, MODEL_TOL, f"d/d input {i}")


def test_module_dropout_dynamic_batch_trains():
    """An ``nn.LSTM`` with dropout, exported with a dynamic batch (as the Trainer does): eval equals torch at another
    batch size; train mode draws masks from the key (same key, same output) and has finite gradients."""
    torch.manual_seed(0)
    module = nn.LSTM(I, H, num_layers=2, dropout=0.5, batch_first=True)
    bm = from_torch(module, (randn(B, T, I),), dynamic_batch=True)
    x = randn(B + 2, T, I)
    module.eval()
    with torch.no_grad():
        ref, (h, c) = module(x)
    (out, (hn, cn)), _ = jax.jit(lambda p, x: bm.apply(p, bm.buffers, None, x, train=False))(bm.params, x.numpy())
    for got, want, what in ((out, ref, "output"), (hn, h, "h_n"), (cn, c, "c_n")):
        assert_close_on_scale(got, want, MODEL_TOL, what)

    @jax.jit
    def train_step(params, key):
        return jax.value_and_grad(lambda p: jnp.sum(bm.apply(p, bm.buffers, key, x.numpy(), train=True)[0][0]))(
            params)

    (l1, g1), (l2, _), (again, _) = (train_step(bm.params, jax.random.key(k)) for k in (0, 1, 0))
    assert float(l1) == float(again) and float(l1) != float(l2)
    assert not np.isclose(float(l1), float(jnp.sum(out)))
    assert all(bool(jnp.isfinite(g).all()) for g in g1.values())
