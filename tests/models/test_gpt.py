"""Byte-level GPT: shapes, causality, tied embeddings, nanoGPT init, dropout keys, jit == eager."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.core.model import from_nnx
from jaxcomposer.models import GPT, num_params

# its module-scoped fixtures and caches are built once per worker: keep its tests on one xdist worker
pytestmark = pytest.mark.xdist_group("test_gpt")

CFG = dict(vocab_size=256, seq_len=16, d_model=32, n_layers=2, n_heads=2)


def gpt_params(vocab, seq_len, d, layers, ratio=4, tied=True):
    """By hand: embeddings, per block 2 LayerNorms + qkv + proj + MLP (all with biases), final LN, optional head."""
    block = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * ratio * d + ratio * d) + (ratio * d * d + d)
    return vocab * d + seq_len * d + layers * block + 2 * d + (0 if tied else d * vocab)


@pytest.fixture(scope="module")
def model():
    return GPT(**CFG, rngs=nnx.Rngs(0))


@nnx.jit
def logits(model, x):
    """The eval forward, jitted: eager dispatch compiles each of the model's ops on its own (test_jit_equals_eager
    covers the eager path)."""
    return model(x, train=False)


def tokens(key, b=2, t=16):
    return jax.random.randint(key, (b, t), 0, 256)


def test_shapes_and_dtype(model, key):
    assert logits(model, tokens(key)).shape == (2, 16, 256)
    out = logits(model, tokens(key, t=5))  # shorter than seq_len is fine
    assert out.shape == (2, 5, 256) and out.dtype == jnp.float32
    with pytest.raises(ValueError, match="exceeds seq_len=16"):
        model(tokens(key, t=17), train=False)


def test_param_counts(model):
    assert num_params(model) == gpt_params(256, 16, 32, 2)
    untied = nnx.eval_shape(lambda: GPT(**CFG, tie_embeddings=False, rngs=nnx.Rngs(0)))
    assert num_params(untied) == gpt_params(256, 16, 32, 2, tied=False) == num_params(model) + 32 * 256
    default = nnx.eval_shape(lambda: GPT(rngs=nnx.Rngs(0)))
    assert num_params(default) == gpt_params(256, 128, 128, 4) == 842_496


def test_tied_embedding_is_the_only_vocab_matrix(model):
    leaves = jax.tree_util.tree_leaves(nnx.state(model, nnx.Param))
    assert sum(1 for leaf in leaves if 256 in leaf.shape) == 1
    h = jax.random.normal(jax.random.key(1), (3, 32))
    np.testing.assert_allclose(model.wte.attend(h), h @ model.wte.embedding[...].T, rtol=1e-5, atol=1e-6)


def test_causality(model, key):
    x = tokens(key)
    y = x.at[:, 9].set((x[:, 9] + 1) % 256)
    a, b = logits(model, x), logits(model, y)
    np.testing.assert_allclose(a[:, :9], b[:, :9], rtol=1e-5, atol=1e-6)
    assert not np.allclose(a[:, 9:], b[:, 9:])


def test_nanogpt_init(model):
    assert abs(float(model.wte.embedding[...].std()) - 0.02) < 0.002
    resid = model.blocks[0].fc_proj.kernel[...]
    assert abs(float(resid.std()) / (0.02 / math.sqrt(2 * 2)) - 1) < 0.1
    assert float(jnp.abs(model.blocks[0].attn.qkv.bias[...]).max()) == 0.0


def test_initial_loss_near_uniform(model, key):
    x = tokens(key, b=4, t=16)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(logits(model, x[:, :-1])), x[:, 1:, None], axis=-1).mean()
    assert abs(float(ce) - math.log(256)) < 0.1


def test_dropout_uses_the_key(key):
    pure = from_nnx(GPT(**CFG, dropout=0.3, rngs=nnx.Rngs(0)))
    x = tokens(key)
    k1, k2 = jax.random.split(key)
    run = jax.jit(lambda train, k: pure.apply(pure.params, pure.state, x, train=train, key=k)[0],
                  static_argnums=0)
    np.testing.assert_array_equal(run(True, k1), run(True, k1))
    assert not np.allclose(run(True, k1), run(True, k2))
    np.testing.assert_array_equal(run(False, k1), run(False, k2))
    assert not np.allclose(run(True, k1), run(False, k1))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        pure.apply(pure.params, pure.state, x, train=True, key=None)


def test_jit_equals_eager(model, key):
    pure = from_nnx(model)
    x = tokens(key)
    f = lambda p, s, x: pure.apply(p, s, x, train=False)[0]
    np.testing.assert_allclose(jax.jit(f)(pure.params, pure.state, x), f(pure.params, pure.state, x),
                               rtol=1e-4, atol=1e-5)
