"""Per-op parity for torch_bridge/ops/nn.py: each lowering against the ATen op itself on random float32 inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_bridge  # noqa: F401  registers the ops
from torch_bridge import kernels
from torch_bridge.ops import nn as nn_ops
from torch_bridge.ops.registry import lookup
from tests.torch_bridge.parity import LAYER_TOL, assert_close_on_scale, to_jax

A = torch.ops.aten


def run(op, *args, **kwargs):
    lowering = lookup(op)
    assert lowering is not None, f"{op} is not lowered"
    return lowering.fn(*to_jax(args), **{k: to_jax(v) for k, v in kwargs.items()})


def close(ours, ref, atol=1e-5):
    if isinstance(ref, (tuple, list)):
        assert len(ours) == len(ref)
        for o, r in zip(ours, ref):
            close(o, r, atol)
        return
    ref = ref.detach().numpy()
    assert tuple(ours.shape) == ref.shape, (ours.shape, ref.shape)
    np.testing.assert_allclose(np.asarray(ours), ref, atol=atol, rtol=1e-5)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------- conv / linear
@pytest.mark.parametrize("shape,wshape,kw", [
    ((2, 4, 9, 9), (6, 4, 3, 3), dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)),
    ((2, 4, 9, 8), (6, 2, 3, 2), dict(stride=[2, 1], padding=[0, 1], dilation=[2, 1], groups=2)),
    ((2, 4, 11), (8, 4, 5), dict(stride=[2], padding=[2], dilation=[1], groups=1)),
    ((2, 4, 5, 6, 6), (4, 1, 3, 3, 3), dict(stride=[1, 1, 1], padding=[1, 0, 1], dilation=[1, 1, 1], groups=4)),
    ((4, 9, 9), (6, 4, 3, 3), dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)),  # unbatched
])
@pytest.mark.parametrize("bias", [True, False])
def test_convolution(shape, wshape, kw, bias):
    x, w = randn(*shape), randn(*wshape, seed=1)
    b = randn(wshape[0], seed=2) if bias else None
    nd = len(wshape) - 2
    if nd == 2:
        close(run(A.conv2d.default, x, w, b, **kw), A.conv2d.default(x, w, b, **kw))
    if len(shape) == nd + 1:  # unbatched: only conv2d accepts it
        return
    ref = A.convolution.default(x, w, b, kw["stride"], kw["padding"], kw["dilation"], False, [0] * nd, kw["groups"])
    close(run(A.convolution.default, x, w, b, kw["stride"], kw["padding"], kw["dilation"], False, [0] * nd,
              kw["groups"]), ref)


_DEPTHWISE = [
    ((3, 5, 9, 9), (5, 1, 3, 3), dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1])),  # MobileNet's 3x3
    ((2, 4, 11, 10), (4, 1, 5, 5), dict(stride=[2, 2], padding=[2, 2], dilation=[1, 1])),  # EfficientNet's 5x5/2
    ((2, 3, 9, 8), (6, 1, 3, 2), dict(stride=[2, 1], padding=[0, 1], dilation=[2, 1])),  # multiplier 2, dilated
    ((1, 4, 6, 7), (4, 1, 7, 7), dict(stride=[1, 1], padding=[3, 3], dilation=[1, 1])),
]


# the taps lowering on the two geometries that exercise all of it (strides, multiplier, dilation; each compile of
# its unrolled taps with gradients is slow)
@pytest.mark.parametrize("shape,wshape,kw,impl", [(*c, "onednn") for c in _DEPTHWISE] +
                         [(*c, "taps") for c in _DEPTHWISE[1:3]])
def test_depthwise_convolution_values_and_gradients(shape, wshape, kw, impl, monkeypatch):
    """Depthwise convolutions run on oneDNN on CPU, else (no kernel library, or float64) as shifted slices times
    per-channel taps: each path's values and both gradients against torch autograd at the per-layer tolerance,
    eagerly and under jit."""
    x, w, b = randn(*shape), randn(*wshape, seed=1), randn(wshape[0], seed=2)
    lowering = lookup(A.conv2d.default).fn
    if impl == "taps":
        monkeypatch.setattr(kernels, "available", lambda: False)
    called = []
    monkeypatch.setattr(nn_ops, "_depthwise_by_taps", lambda *a, f=nn_ops._depthwise_by_taps: called.append(1) or f(*a))

    def fn(*a):  # a function of its own per path, so jit never reuses the other path's trace
        return lowering(*a)
    args = (kw["stride"], kw["padding"], kw["dilation"], shape[1])
    xt, wt = x.clone().requires_grad_(), w.clone().requires_grad_()
    ref = A.conv2d.default(xt, wt, b, *args)
    g = randn(*ref.shape, seed=3)
    ref.backward(g)
    loss = lambda xj, wj: jnp.sum(fn(xj, wj, to_jax(b), *args) * to_jax(g))
    for f in (fn, jax.jit(fn, static_argnums=(3, 4, 5, 6))):  # eagerly, then under jit
        close(f(to_jax(x), to_jax(w), to_jax(b), *(tuple(a) if isinstance(a, list) else a for a in args)), ref)
    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(to_jax(x), to_jax(w))
    # a weight gradient sums over batch and space: held to the per-layer bound on its own scale
    assert_close_on_scale(gx, xt.grad, LAYER_TOL, "dx")
    assert_close_on_scale(gw, wt.grad, LAYER_TOL, "dw")
    assert bool(called) == (impl == "taps")


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_conv2d_string_padding(padding):
    x, w = randn(2, 3, 8, 7), randn(5, 3, 4, 3, seed=1)
    ref = A.conv2d.padding(x, w, None, [1, 1], padding, [2, 1], 1)
    close(run(A.conv2d.padding, x, w, None, [1, 1], padding, [2, 1], 1), ref)


@pytest.mark.parametrize("stride,padding,output_padding,groups,dilation", [
    (2, 1, 1, 1, 1), (1, 0, 0, 2, 1), (3, 2, 1, 2, 2)])
def test_conv_transpose2d(stride, padding, output_padding, groups, dilation):
    x, w, b = randn(2, 4, 5, 6), randn(4, 3, 3, 3, seed=1), randn(3 * groups, seed=2)
    args = ([stride] * 2, [padding] * 2, [dilation] * 2, True, [output_padding] * 2, groups)
    close(run(A.convolution.default, x, w, b, *args), A.convolution.default(x, w, b, *args))


def test_linear_and_matmuls():
    x, w, b = randn(3, 5, 7), randn(4, 7, seed=1), randn(4, seed=2)
    close(run(A.linear.default, x, w, b), A.linear.default(x, w, b))
    close(run(A.linear.default, x, w), A.linear.default(x, w))
    m1, m2, bias = randn(3, 7), randn(7, 4, seed=1), randn(4, seed=2)
    close(run(A.addmm.default, bias, m1, m2), A.addmm.default(bias, m1, m2))
    close(run(A.addmm.default, bias, m1, m2, beta=0.5, alpha=2.0), A.addmm.default(bias, m1, m2, beta=0.5, alpha=2.0))
    close(run(A.mm.default, m1, m2), A.mm.default(m1, m2))
    a, c = randn(2, 3, 7), randn(2, 7, 4, seed=1)
    close(run(A.bmm.default, a, c), A.bmm.default(a, c))
    close(run(A.matmul.default, a, m2), A.matmul.default(a, m2))


# --------------------------------------------------------------------------------------------- normalization
@pytest.mark.parametrize("shape", [(8, 3, 5, 4), (16, 6), (4, 3, 7)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_functional(shape, training):
    c = shape[1]
    x, w, b = randn(*shape) * 2 + 1, randn(c, seed=1), randn(c, seed=2)
    rm, rv = randn(c, seed=3), torch.rand(c, generator=torch.Generator().manual_seed(4)) + 0.5
    ref = A._native_batch_norm_legit_functional.default(x, w, b, rm, rv, training, 0.1, 1e-5)
    ours = run(A._native_batch_norm_legit_functional.default, x, w, b, rm, rv, training, 0.1, 1e-5)
    if training:
        close(ours, ref)  # out, batch mean, batch rstd, running mean, running var (unbiased)
    else:
        close(ours[0], ref[0])
        close(ours[3:], ref[3:])


def test_batch_norm_running_stats_have_no_gradient():
    x, rm, rv = to_jax(randn(8, 3, 4, 4)), jnp.zeros(3), jnp.ones(3)
    fn = lookup(A._native_batch_norm_legit_functional.default).fn
    g = jax.grad(lambda x: fn(x, None, None, rm, rv, True, 0.1, 1e-5)[3].sum())(x)
    assert float(jnp.abs(g).max()) == 0.0


def test_batch_norm_no_training_and_no_stats():
    x, w, b = randn(4, 3, 5, 5), randn(3, seed=1), randn(3, seed=2)
    rm, rv = randn(3, seed=3), torch.rand(3) + 0.5
    ref = A._native_batch_norm_legit_no_training.default(x, w, b, rm, rv, 0.1, 1e-5)
    close(run(A._native_batch_norm_legit_no_training.default, x, w, b, rm, rv, 0.1, 1e-5)[0], ref[0])
    ref = A._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)
    close(run(A._native_batch_norm_legit.no_stats, x, w, b, True, 0.1, 1e-5), ref)


@pytest.mark.parametrize("normalized", [[7], [5, 7]])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(normalized, affine):
    x = randn(3, 5, 7) * 3 + 1
    w, b = (randn(*normalized, seed=1), randn(*normalized, seed=2)) if affine else (None, None)
    close(run(A.native_layer_norm.default, x, normalized, w, b, 1e-5),
          A.native_layer_norm.default(x, normalized, w, b, 1e-5))
    close(run(A.layer_norm.default, x, normalized, w, b, 1e-5), A.layer_norm.default(x, normalized, w, b, 1e-5))


def test_group_norm():
    x, w, b = randn(2, 6, 4, 5) * 2, randn(6, seed=1), randn(6, seed=2)
    close(run(A.native_group_norm.default, x, w, b, 2, 6, 20, 3, 1e-5),
          A.native_group_norm.default(x, w, b, 2, 6, 20, 3, 1e-5))
    close(run(A.group_norm.default, x, 2, w, b, 1e-5), A.group_norm.default(x, 2, w, b, 1e-5))


def test_embedding_and_padding_idx_gradient():
    w, idx = randn(10, 4), torch.tensor([[1, 0, 3], [0, 9, 9]])
    close(run(A.embedding.default, w, idx), A.embedding.default(w, idx))
    w_t = w.clone().requires_grad_()
    A.embedding.default(w_t, idx, 0).pow(2).sum().backward()
    fn = lookup(A.embedding.default).fn
    g = jax.grad(lambda w: (fn(w, to_jax(idx), 0) ** 2).sum())(to_jax(w))
    close(g, w_t.grad)
    assert float(jnp.abs(g[0]).max()) == 0.0


# --------------------------------------------------------------------------------------------- attention
def _qkv(b=2, h=4, t=6, s=6, d=8, hk=None):
    return randn(b, h, t, d), randn(b, hk or h, s, d, seed=1), randn(b, hk or h, s, d, seed=2)


@pytest.mark.parametrize("kind", ["plain", "causal", "bool_mask", "float_mask", "scale", "cross", "gqa", "3d"])
def test_sdpa(kind):
    q, k, v = _qkv(s=9 if kind == "cross" else 6, hk=2 if kind == "gqa" else None)
    kw = {}
    if kind in ("causal", "cross"):
        kw["is_causal"] = True
    if kind == "bool_mask":
        kw["attn_mask"] = torch.rand(6, 6, generator=torch.Generator().manual_seed(5)) > 0.3
        kw["attn_mask"][:, 0] = True  # no fully masked row
    if kind == "float_mask":
        kw["attn_mask"] = randn(2, 1, 6, 6, seed=6)
    if kind == "scale":
        kw["scale"] = 0.3
    if kind == "gqa":
        kw["enable_gqa"] = True
    if kind == "3d":
        q, k, v = q[:, 0], k[:, 0], v[:, 0]
    ref = A.scaled_dot_product_attention.default(q, k, v, **kw)
    close(run(A.scaled_dot_product_attention.default, q, k, v, **kw), ref)
    if kind != "3d":  # the explicit-softmax path taken for dropout agrees with torch when nothing is dropped
        from torch_bridge.ops.nn import _attention_with_dropout
        mask = to_jax(kw.get("attn_mask"))
        mask = None if mask is None else jnp.broadcast_to(mask.reshape((1,) * (4 - mask.ndim) + mask.shape),
                                                          ref.shape[:3] + (k.shape[2],))
        bool_mask, bias = (mask, None) if mask is not None and mask.dtype == jnp.bool_ else (None, mask)
        ours = _attention_with_dropout(*to_jax((q, k, v)), bool_mask, bias, kw.get("is_causal", False),
                                       kw.get("scale") or q.shape[-1] ** -0.5, 0.0, None)
        close(ours, ref)


def test_sdpa_dropout_uses_key():
    q, k, v = (to_jax(t) for t in _qkv())
    fn = lookup(A.scaled_dot_product_attention.default).fn
    assert lookup(A.scaled_dot_product_attention.default).random
    k0, k1 = jax.random.key(0), jax.random.key(1)
    a, b, c = (fn(q, k, v, None, 0.5, True, key=kk) for kk in (k0, k0, k1))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.allclose(np.asarray(a), np.asarray(c))
    # mean over many keys approaches the no-dropout output (inverted dropout is unbiased)
    keys = jax.random.split(k0, 1600)
    mean = jax.vmap(lambda kk: fn(q, k, v, None, 0.5, True, key=kk))(keys).mean(0)
    np.testing.assert_allclose(np.asarray(mean), np.asarray(fn(q, k, v, None, 0.0, True)), atol=0.25)
    with pytest.raises(ValueError, match="PRNG key"):
        fn(q, k, v, None, 0.5, True, key=None)


# --------------------------------------------------------------------------------------------- dropout
def test_native_dropout_key_and_scaling():
    x = jnp.ones((64, 64))
    fn = lookup(A.native_dropout.default).fn
    k0, k1 = jax.random.key(0), jax.random.key(1)
    (o0, m0), (o0b, m0b), (o1, m1) = fn(x, 0.3, True, key=k0), fn(x, 0.3, True, key=k0), fn(x, 0.3, True, key=k1)
    np.testing.assert_array_equal(np.asarray(m0), np.asarray(m0b))
    assert not np.array_equal(np.asarray(m0), np.asarray(m1))
    assert m0.dtype == jnp.bool_
    np.testing.assert_allclose(np.asarray(o0), np.where(np.asarray(m0), 1 / 0.7, 0.0), rtol=1e-6)
    assert abs(float(m0.mean()) - 0.7) < 0.03 and abs(float(o0.mean()) - 1.0) < 0.05
    out, mask = fn(x, 0.3, False, key=None)  # eval: identity, all-kept mask, like torch
    ref_out, ref_mask = A.native_dropout.default(torch.ones(64, 64), 0.3, False)
    close(out, ref_out)
    np.testing.assert_array_equal(np.asarray(mask), ref_mask.numpy())
    d = lookup(A.dropout.default).fn
    np.testing.assert_array_equal(np.asarray(d(x, 0.3, True, key=k0)), np.asarray(o0))
    np.testing.assert_array_equal(np.asarray(d(x, 0.3, False, key=None)), np.asarray(x))
    with pytest.raises(ValueError, match="PRNG key"):
        fn(x, 0.3, True, key=None)


# --------------------------------------------------------------------------------------------- activations
@pytest.mark.parametrize("op,args,kwargs", [
    (A.relu.default, (), {}), (A.silu.default, (), {}), (A.sigmoid.default, (), {}), (A.tanh.default, (), {}),
    (A.mish.default, (), {}), (A.gelu.default, (), {}), (A.gelu.default, (), {"approximate": "tanh"}),
    (A.hardtanh.default, (-0.5, 2.0), {}), (A.leaky_relu.default, (0.2,), {}), (A.elu.default, (1.3, 1.1, 0.9), {}),
    (A.hardswish.default, (), {}), (A.hardsigmoid.default, (), {}), (A.softplus.default, (2.0, 3.0), {}),
    (A._softmax.default, (1, False), {}), (A._log_softmax.default, (-1, False), {}),
    (A.softmax.int, (0,), {}), (A.log_softmax.int, (2,), {}),
])
def test_activation(op, args, kwargs):
    x = randn(3, 4, 5) * 3
    close(run(op, x, *args, **kwargs), op(x, *args, **kwargs))


# --------------------------------------------------------------------------------------------- pooling / padding
@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil_mode", [
    ([2, 2], [2, 2], [0, 0], [1, 1], False), ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([3, 2], [2, 3], [1, 0], [2, 1], True), ([3, 3], [], [0, 0], [1, 1], True)])
def test_max_pool2d(kernel, stride, padding, dilation, ceil_mode):
    x = randn(2, 3, 11, 10)
    args = (kernel, stride, padding, dilation, ceil_mode)
    close(run(A.max_pool2d.default, x, *args), A.max_pool2d.default(x, *args))
    out, idx = run(A.max_pool2d_with_indices.default, x, *args)
    ref_out, ref_idx = A.max_pool2d_with_indices.default(x, *args)
    close(out, ref_out)
    np.testing.assert_array_equal(np.asarray(idx), ref_idx.numpy())


def test_max_pool1d():
    x = randn(2, 3, 13)
    close(run(A.max_pool1d.default, x, [3], [2], [1], [1], True), A.max_pool1d.default(x, [3], [2], [1], [1], True))


@pytest.mark.parametrize("kernel,stride,padding,ceil_mode,include_pad,divisor", [
    ([2, 2], [2, 2], [0, 0], False, True, None), ([3, 3], [2, 2], [1, 1], False, True, None),
    ([3, 3], [2, 2], [1, 1], True, False, None), ([3, 2], [2, 2], [1, 1], True, True, None),
    ([3, 3], [2, 1], [1, 0], False, True, 5)])
def test_avg_pool2d(kernel, stride, padding, ceil_mode, include_pad, divisor):
    x = randn(2, 3, 10, 9)
    args = (kernel, stride, padding, ceil_mode, include_pad, divisor)
    close(run(A.avg_pool2d.default, x, *args), A.avg_pool2d.default(x, *args))


def test_avg_pool1d():
    x = randn(2, 3, 11)
    close(run(A.avg_pool1d.default, x, [3], [2], [1], True, False), A.avg_pool1d.default(x, [3], [2], [1], True, False))


@pytest.mark.parametrize("size", [[1, 1], [2, 3], [3, 4], [5, 5]])
def test_adaptive_avg_pool2d(size):
    x = randn(2, 3, 9, 8)
    close(run(A.adaptive_avg_pool2d.default, x, size), A.adaptive_avg_pool2d.default(x, size))
    close(run(A._adaptive_avg_pool2d.default, x, size), A._adaptive_avg_pool2d.default(x, size))
    close(run(A.adaptive_avg_pool1d.default, x[0], size[:1]), A.adaptive_avg_pool1d.default(x[0], size[:1]))


@pytest.mark.parametrize("pad,value", [([1, 2], 0.0), ([1, 0, 2, 3], -1.5), ([-1, 2, 0, -2], 0.0)])
def test_constant_pad_nd(pad, value):
    x = randn(2, 3, 5, 6)
    close(run(A.constant_pad_nd.default, x, pad, value), A.constant_pad_nd.default(x, pad, value))


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
def test_pad_modes(mode):
    x = randn(2, 3, 5, 6)
    close(run(A.pad.default, x, [1, 2, 2, 1], mode), A.pad.default(x, [1, 2, 2, 1], mode))


@pytest.mark.parametrize("float_mask", [False, True])
@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
def test_sdpa_fully_masked_rows_are_zero_like_torch(float_mask, dropout_p):
    """Left-padded batches (HF attention masks) leave query rows with no visible key: torch returns zeros."""
    import torch
    from torch_bridge.ops.registry import lookup
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8, generator=g) for _ in range(3))
    m = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    m[0, 0, 1] = False
    mask = torch.zeros(m.shape).masked_fill(~m, float("-inf")) if float_mask else m
    fn = lookup(torch.ops.aten.scaled_dot_product_attention.default).fn
    out = np.asarray(fn(*(jnp.asarray(t.numpy()) for t in (q, k, v, mask)), dropout_p, key=jax.random.PRNGKey(0)))
    assert np.all(out[0, :, 1] == 0) and np.all(np.isfinite(out))
    if dropout_p == 0.0:
        ref = torch.ops.aten.scaled_dot_product_attention.default(q, k, v, mask).numpy()
        np.testing.assert_allclose(out, ref, atol=1e-5)
