"""Whole-model parity: a Conv-BN CNN and a small tied-weight GPT, bridged with from_torch, against torch itself."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
import optax
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
Y_IMG = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(2))
X_TOK = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3))
Y_TOK = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(4))
CASES = {"cnn": (make_cnn, X_IMG, Y_IMG), "gpt": (make_gpt, X_TOK, Y_TOK)}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    make, x, y = CASES[request.param]
    module = make()
    return request.param, module, from_torch(module, (x,)), x, y


def ce_jax(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()


def assert_close(ours, ref, tol=MODEL_TOL):
    assert_close_on_scale(ours, ref, tol)


def test_conversion_keeps_module_mode_and_state(case):
    _, module, bm, _, _ = case
    assert isinstance(bm, BridgedModel) and module.training  # nn.Module default mode restored after both exports
    for name, value in bm.params.items():
        np.testing.assert_array_equal(np.asarray(value), module.state_dict()[name].numpy())  # copied exactly


def test_eval_forward_parity(case):
    _, module, bm, x, _ = case
    module.eval()
    try:
        ref = module(x)
    finally:
        module.train()
    out, new_buffers = bm.apply(bm.params, bm.buffers, None, x.numpy(), train=False)
    assert_close(out, ref)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), new_buffers, bm.buffers))


def test_grad_parity_eval_mode(case):
    name, module, bm, x, y = case
    m = copy.deepcopy(module).eval()
    F.cross_entropy(m(x).reshape(-1, m(x).shape[-1]), y.reshape(-1)).backward()
    grads = jax.grad(lambda p: ce_jax(bm.apply(p, bm.buffers, None, x.numpy(), train=False)[0], jnp.asarray(y)))(
        bm.params)
    torch_params = dict(m.named_parameters())  # de-duplicated by torch too: tied grads already summed
    assert set(grads) == set(torch_params)
    for k, g in grads.items():
        assert_close(g, torch_params[k].grad)


def test_jit_equals_eager(case):
    _, _, bm, x, _ = case
    apply = jax.jit(bm.apply, static_argnames="train")
    key = jax.random.key(0)
    for train in (False, True):
        eager = bm.apply(bm.params, bm.buffers, key, x.numpy(), train=train)
        jitted = apply(bm.params, bm.buffers, key, x.numpy(), train=train)
        jax.tree.map(lambda a, b: assert_close_on_scale(b, a, LAYER_TOL), eager, jitted)


def test_dropout_follows_key(case):
    _, _, bm, x, _ = case
    run = lambda k: np.asarray(bm.apply(bm.params, bm.buffers, jax.random.key(k), x.numpy(), train=True)[0])
    np.testing.assert_array_equal(run(0), run(0))
    assert not np.allclose(run(0), run(1))
    with pytest.raises(ValueError, match="PRNG key"):
        bm.apply(bm.params, bm.buffers, None, x.numpy(), train=True)


def test_to_torch_round_trip_after_sgd(case):
    name, _, _, x, y = case
    module = CASES[name][0]()
    bm = from_torch(module, (x,))
    opt = optax.sgd(0.1)
    params, buffers, opt_state = bm.params, bm.buffers, opt.init(bm.params)

    @jax.jit
    def step(params, buffers, opt_state, key):
        def loss(p):
            out, new_b = bm.apply(p, buffers, key, x.numpy(), train=True)
            return ce_jax(out, jnp.asarray(y)), new_b
        (_, buffers), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, opt_state = opt.update(grads, opt_state)
        return optax.apply_updates(params, updates), buffers, opt_state

    for i in range(3):
        params, buffers, opt_state = step(params, buffers, opt_state, jax.random.key(i))
    restored = bm.to_torch(params, buffers)
    assert restored is module
    restored.eval()
    ours = bm.apply(params, buffers, None, x.numpy(), train=False)[0]
    assert_close(ours, restored(x))
    sd = bm.state_dict(params, buffers)
    assert all(sd[k].dtype == v.dtype for k, v in module.state_dict().items())
    if name == "cnn":
        assert int(module.b1.num_batches_tracked) == 3 and module.b1.num_batches_tracked.dtype == torch.int64
    else:
        assert module.head.weight is module.tok.weight


def test_train_mode_batchnorm_stats_match_torch():
    module = make_cnn()
    bm = from_torch(module, (X_IMG,))
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
    bm = from_torch(make_gpt(), (X_TOK,))
    assert "tok.weight" in bm.params and "head.weight" not in bm.params
    assert bm.aliases == {"head.weight": "tok.weight"}
    sd = bm.state_dict(bm.params, bm.buffers)
    assert torch.equal(sd["head.weight"], sd["tok.weight"])


def test_pure_model_protocol():
    module = make_cnn()
    bm = from_torch(module, (X_IMG,))
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


class Spectral(nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x).abs()


class UsesFFT(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.spec = nn.Linear(8, 8), Spectral()

    def forward(self, x):
        return self.spec(self.lin(x))


def test_unsupported_op_raises_at_conversion():
    with pytest.raises(UnsupportedOpError) as info:
        from_torch(UsesFFT(), (torch.randn(2, 8),))
    err = info.value
    assert isinstance(err, NotImplementedError)
    assert any("fft" in op for op in err.ops)
    message = str(err)
    assert "spec (Spectral)" in message and "torch.fft.rfft" in message
    assert torch_bridge.UnsupportedOpError is UnsupportedOpError
