"""MLP: flattening, dropout driven only by the key, parameter count, jit == eager."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.core.model import from_nnx
from jaxcomposer.models import MLP, num_params


def test_flattens_any_trailing_shape(key):
    m = MLP(28 * 28, hidden=(32, 16), num_classes=10, rngs=nnx.Rngs(0))
    out = m(jax.random.normal(key, (4, 28, 28, 1)), train=False)
    assert out.shape == (4, 10) and out.dtype == jnp.float32
    with pytest.raises(ValueError, match="in_features=784"):
        m(jnp.ones((4, 10)), train=False)


def test_param_count_matches_formula():
    m = MLP(784, hidden=(256,), num_classes=10, rngs=nnx.Rngs(0))
    assert num_params(m) == 784 * 256 + 256 + 256 * 10 + 10 == 203_530
    assert num_params(from_nnx(m).params) == num_params(from_nnx(m)) == 203_530


def test_dropout_uses_the_key(key):
    m = MLP(8, hidden=(64,), num_classes=3, dropout=0.5, rngs=nnx.Rngs(0))
    pure = from_nnx(m)
    x = jax.random.normal(key, (5, 8))
    k1, k2 = jax.random.split(key)
    run = lambda train, k: pure.apply(pure.params, pure.state, x, train=train, key=k)[0]
    np.testing.assert_array_equal(run(True, k1), run(True, k1))
    assert not np.allclose(run(True, k1), run(True, k2))
    np.testing.assert_array_equal(run(False, k1), run(False, k2))
    np.testing.assert_array_equal(run(False, None), run(False, k1))
    assert not np.allclose(run(True, k1), run(False, None))
    with pytest.raises(ValueError, match="needs a PRNG key"):
        run(True, None)


def test_no_dropout_needs_no_key(key):
    m = MLP(8, hidden=(16,), num_classes=3, rngs=nnx.Rngs(0))
    x = jax.random.normal(key, (2, 8))
    np.testing.assert_array_equal(m(x, train=True), m(x, train=False))


def test_jit_equals_eager(key):
    pure = from_nnx(MLP(8, hidden=(16, 16), num_classes=3, dropout=0.2, rngs=nnx.Rngs(1)))
    x = jax.random.normal(key, (6, 8))
    f = lambda p, s, x, k: pure.apply(p, s, x, train=True, key=k)[0]
    np.testing.assert_allclose(jax.jit(f)(pure.params, pure.state, x, key), f(pure.params, pure.state, x, key),
                               rtol=1e-5, atol=1e-6)
