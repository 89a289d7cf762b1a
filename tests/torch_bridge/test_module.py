"""``BridgedModel``'s own behaviour on a Conv-BN CNN and a small tied-weight GPT: what conversion keeps, eager
equals jit, dropout keys, BatchNorm statistics, tied weights, the PureModel protocol, static/dynamic batch,
structured outputs, unsupported ops. Output, gradient and round-trip parity with torch for these kinds of model
(and the rest of the zoo) are tests/torch_bridge/test_zoo_parity.py's."""
import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_bridge
from tests.torch_bridge.parity import LAYER_TOL, MODEL_TOL, assert_close_on_scale
from torch_bridge import BridgedModel, UnsupportedOpError, from_torch

# its module-scoped fixtures and caches are built once per worker: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_module")


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.pool, self.drop, self.fc = nn.MaxPool2d(2), nn.Dropout(0.5), nn.Linear(16, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.b1(self.c1(x))))
        x = self.pool(F.relu(self.b2(self.c2(x))))
        return self.fc(self.drop(F.adaptive_avg_pool2d(x, 1).flatten(1)))


class Block(nn.Module):
    def __init__(self, d, heads, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.drop = nn.LayerNorm(d), nn.Dropout(p)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.p if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, vocab=64, block=16, d=32, heads=4, layers=2, p=0.1):
        super().__init__()
        self.tok, self.pos, self.drop = nn.Embedding(vocab, d), nn.Embedding(block, d), nn.Dropout(p)
        self.blocks = nn.ModuleList([Block(d, heads, p) for _ in range(layers)])
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied LM head

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x))


def make_cnn():
    torch.manual_seed(0)
    m = CNN()
    with torch.no_grad():  # non-trivial running stats so the eval graph really uses them
        for bn in (m.b1, m.b2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return m


def make_gpt():
    torch.manual_seed(0)
    return GPT()


X_IMG = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(1))
X_TOK = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3))
CASES = {"cnn": (make_cnn, X_IMG), "gpt": (make_gpt, X_TOK)}


@functools.cache
def converted(name):
    """(module, BridgedModel, input), converted once per worker; no test writes weights back into the module."""
    make, x = CASES[name]
    module = make()
    return module, from_torch(module, (x,)), x


@pytest.fixture(params=list(CASES))
def case(request):
    return converted(request.param)


def assert_close(ours, ref, tol=MODEL_TOL):
    assert_close_on_scale(ours, ref, tol)


def test_conversion_keeps_module_mode_and_state(case):
    module, bm, _ = case
    assert isinstance(bm, BridgedModel) and module.training  # nn.Module default mode restored after both exports
    for name, value in bm.params.items():
        np.testing.assert_array_equal(np.asarray(value), module.state_dict()[name].numpy())  # copied exactly


def test_converted_arrays_do_not_share_the_modules_memory():
    """The module's tensors written in place after conversion (a torch optimizer step, ``to_torch``) leave the
    bridged params and buffers as converted: they are copies, not views of torch's memory (a device_put of a
    tensor's .numpy() alone would alias it on CPU)."""
    module = nn.Sequential(nn.Linear(4, 16), nn.BatchNorm1d(16))
    bm = from_torch(module, (torch.randn(2, 4),))
    before = {k: np.array(v) for k, v in {**bm.params, **bm.buffers}.items()}
    with torch.no_grad():
        for tensor in module.state_dict().values():
            tensor.add_(1)
    for k, v in {**bm.params, **bm.buffers}.items():
        np.testing.assert_array_equal(np.asarray(v), before[k], err_msg=k)


def test_jit_equals_eager(case):
    _, bm, x = case
    apply = jax.jit(bm.apply, static_argnames="train")
    key = jax.random.key(0)
    for train in (False, True):
        eager = bm.apply(bm.params, bm.buffers, key, x.numpy(), train=train)
        jitted = apply(bm.params, bm.buffers, key, x.numpy(), train=train)
        jax.tree.map(lambda a, b: assert_close_on_scale(b, a, LAYER_TOL), eager, jitted)


def test_dropout_follows_key(case):
    _, bm, x = case
    apply = jax.jit(bm.apply, static_argnames="train")
    run = lambda k: np.asarray(apply(bm.params, bm.buffers, jax.random.key(k), x.numpy(), train=True)[0])
    np.testing.assert_array_equal(run(0), run(0))
    assert not np.allclose(run(0), run(1))
    with pytest.raises(ValueError, match="PRNG key"):
        bm.apply(bm.params, bm.buffers, None, x.numpy(), train=True)


def test_train_mode_batchnorm_stats_match_torch():
    module, bm, _ = converted("cnn")
    assert bm.buffers["b1.num_batches_tracked"].dtype == jnp.int32
    ref = copy.deepcopy(module).train()
    ref(X_IMG)
    _, new = bm.apply(bm.params, bm.buffers, jax.random.key(0), X_IMG.numpy(), train=True)
    stats = ("running_mean", "running_var", "num_batches_tracked")
    assert set(new) == {f"{b}.{s}" for b in ("b1", "b2") for s in stats}
    for k, v in ref.state_dict().items():
        if k in new:
            assert_close(new[k], v, LAYER_TOL)
            assert new[k].dtype == bm.buffers[k].dtype


def test_tied_weights_appear_once():
    _, bm, _ = converted("gpt")
    assert "tok.weight" in bm.params and "head.weight" not in bm.params
    assert bm.aliases == {"head.weight": "tok.weight"}
    sd = bm.state_dict(bm.params, bm.buffers)
    assert torch.equal(sd["head.weight"], sd["tok.weight"])


def test_pure_model_protocol():
    _, bm, _ = converted("cnn")
    pm = bm.as_pure_model()
    out, state = pm.apply(pm.params, pm.state, X_IMG.numpy(), train=False, key=None)
    np.testing.assert_allclose(np.asarray(out), np.asarray(bm.apply(bm.params, bm.buffers, None, X_IMG.numpy(),
                                                                    train=False)[0]))
    assert set(state) == set(bm.buffers)


def test_dynamic_batch_and_shape_errors():
    module = make_cnn().eval()
    bm = from_torch(module, (X_IMG,))
    with pytest.raises(ValueError, match="dynamic_batch=True"):
        bm.apply(bm.params, bm.buffers, None, X_IMG[:3].numpy(), train=False)
    dyn = from_torch(module, (X_IMG,), dynamic_batch=True)
    out, _ = dyn.apply(dyn.params, dyn.buffers, None, X_IMG[:3].numpy(), train=False)
    assert_close(out, module(X_IMG[:3]))


class Ramp(nn.Module):
    """A forward that makes a tensor from its input's size: each size's export lifts its own constant."""

    def forward(self, x):
        return x * torch.tensor([float(i) for i in range(x.shape[-1])])


def test_other_input_sizes_get_their_own_export():
    """Inputs whose non-batch dims differ from the example's (ProgressiveResizing's smaller images, a shorter
    sequence) run a graph exported for their size, once per size; the weights are the same pytree."""
    cnn = make_cnn().eval()
    bm = from_torch(cnn, (X_IMG,), dynamic_batch=True)
    small = X_IMG[:5, :, :12, :12]
    out, buffers = jax.jit(lambda p, b, x: bm.apply(p, b, None, x, train=False))(bm.params, bm.buffers, small.numpy())
    assert_close(out, cnn(small))
    assert len(bm._resized) == 1 and set(buffers) == set(bm.buffers)
    bm.apply(bm.params, bm.buffers, None, X_IMG[:2, :, :12, :12].numpy(), train=False)  # another batch: same graph
    assert len(bm._resized) == 1
    # tied weights (the GPT's head is its embedding) and a position table indexed by the sequence length
    gpt = make_gpt().eval()
    g = from_torch(gpt, (X_TOK,), dynamic_batch=True)
    assert_close(g.apply(g.params, g.buffers, None, X_TOK[:, :9].numpy(), train=False)[0], gpt(X_TOK[:, :9]))
    # each export's lifted constants stay with its graph (both are named lifted_tensor_0)
    ramp = from_torch(Ramp(), (torch.ones(2, 4),), dynamic_batch=True)
    for width in (3, 4, 5, 3):
        got, _ = ramp.apply(ramp.params, ramp.buffers, None, np.ones((2, width), np.float32), train=False)
        np.testing.assert_array_equal(np.asarray(got), np.tile(np.arange(width, dtype=np.float32), (2, 1)))
    with pytest.raises(RuntimeError, match="exporting it again for those failed"):
        bm.apply(bm.params, bm.buffers, None, X_IMG[:2, :1].numpy(), train=False)  # 1 channel: not this conv


class TwoHeads(nn.Module):
    """Multi-input, dict output, a non-persistent buffer and a constant."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]), persistent=False)

    def forward(self, a, b):
        h = self.lin(a) * self.scale
        return {"sum": h + b, "pair": (h, torch.tanh(b))}


def test_structured_outputs_and_constants():
    module = TwoHeads()
    a, b = torch.randn(2, 4), torch.randn(2, 3)
    bm = from_torch(module, (a, b))
    assert "scale" in bm.constants and "scale" not in bm.buffers and "scale" not in bm.params
    out, _ = bm.apply(bm.params, bm.buffers, None, a.numpy(), b.numpy(), train=False)
    ref = module(a, b)
    assert set(out) == {"sum", "pair"} and isinstance(out["pair"], tuple)
    assert_close(out["sum"], ref["sum"])
    assert_close(out["pair"][1], ref["pair"][1])
    pm_out, _ = bm.as_pure_model().apply(bm.params, bm.buffers, (a.numpy(), b.numpy()), train=False)
    assert_close(pm_out["pair"][0], ref["pair"][0])
    bm.to_torch(bm.params, bm.buffers)  # strict load works without the non-persistent buffer


class Orthogonalize(nn.Module):  # linear algebra decompositions are not lowered
    def forward(self, x):
        return torch.linalg.qr(x)[0]


class UsesQR(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.spec = nn.Linear(8, 8), Orthogonalize()

    def forward(self, x):
        return self.spec(self.lin(x))


def test_unsupported_op_raises_at_conversion():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(UsesQR(), (torch.randn(2, 8),))
    err = info.value
    assert isinstance(err, NotImplementedError)
    assert any("qr" in op for op in err.ops)
    message = str(err)
    assert "spec (Orthogonalize)" in message and "torch.linalg.qr" in message
    # advice a user can act on, not a pointer into the bridge's source tree
    assert "What you can do" in message and "torch_bridge/ops/" not in message
    assert torch_bridge.UnsupportedOpError is UnsupportedOpError
