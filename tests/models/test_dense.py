"""dense_dot_general: the same values and gradients as autodiff of lax.dot_general, and on the CPU a kernel gradient
compiled as an ordinary product (no generic `dot` contracting the batch axis)."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import lax

from jaxcomposer.models import ConvNet
from jaxcomposer.models.dense import dense_dot_general

DENSE = lambda x: (((x.ndim - 1,), (0,)), ((), ()))


def _loss(dot):
    return lambda x, w, t: jnp.sum(jnp.tanh(dot(x, w, DENSE(x))) * t)


@pytest.mark.parametrize("x_shape, n", [((128, 1536), 10), ((3, 5, 32), 7)])
def test_values_and_gradients_equal_autodiffs(x_shape, n):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(x_shape), jnp.float32)
    w = jnp.asarray(rng.standard_normal((x_shape[-1], n)) / np.sqrt(x_shape[-1]), jnp.float32)
    t = jnp.asarray(rng.standard_normal((*x_shape[:-1], n)), jnp.float32)
    np.testing.assert_allclose(dense_dot_general(x, w, DENSE(x)), lax.dot_general(x, w, DENSE(x)), rtol=1e-5,
                               atol=1e-5)
    ours = jax.jit(jax.grad(_loss(dense_dot_general), argnums=(0, 1)))(x, w, t)
    plain = jax.jit(jax.grad(_loss(lax.dot_general), argnums=(0, 1)))(x, w, t)
    for a, b in zip(ours, plain):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # grad of grad: the backward is made of differentiable ops
    second = lambda dot: jax.jit(jax.grad(lambda w: jnp.sum(jax.grad(_loss(dot))(x, w, t) ** 2)))(w)
    np.testing.assert_allclose(second(dense_dot_general), second(lax.dot_general), rtol=1e-4, atol=1e-5)


def test_bf16_operands_keep_their_dtype_in_the_gradients():
    x = jnp.ones((4, 8), jnp.bfloat16)
    w = jnp.full((8, 3), 0.5, jnp.bfloat16)
    dx, dw = jax.grad(lambda x, w: dense_dot_general(x, w, DENSE(x)).astype(jnp.float32).sum(), argnums=(0, 1))(x, w)
    assert (dx.dtype, dw.dtype) == (jnp.bfloat16, jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(dw, np.float32), np.full((8, 3), 4.0))
    np.testing.assert_array_equal(np.asarray(dx, np.float32), np.full((4, 8), 1.5))


def test_the_cpu_kernel_gradient_is_an_ordinary_product():
    x, w, t = jnp.ones((128, 1536)), jnp.ones((1536, 10)), jnp.ones((128, 10))
    def generic_dots(dot) -> list[str]:  # the entry computation's own dots (a YNNPACK fusion holds one inside)
        text = jax.jit(jax.grad(_loss(dot), argnums=1)).lower(x, w, t).compile().as_text()
        return re.findall(r"= f32\[[\d,]*\]\{[\d,]*\} dot\(", text[text.index("ENTRY"):])

    # compiled as users' programs are: tests/conftest.py turns most of XLA's optimizations off, YNNPACK's with them
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        assert generic_dots(lax.dot_general)  # autodiff's: Eigen's generic contraction over the batch axis
        assert not generic_dots(dense_dot_general)
    finally:
        jax.config.update("jax_disable_most_optimizations", True)


def test_products_it_does_not_cover_go_to_lax_unchanged():
    x, w = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
    batched = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(dense_dot_general(x, w, batched), lax.dot_general(x, w, batched))
    v = jnp.ones((4, 5))
    high = dense_dot_general(x, v, DENSE(x), precision=lax.Precision.HIGHEST)
    np.testing.assert_array_equal(high, lax.dot_general(x, v, DENSE(x), precision=lax.Precision.HIGHEST))
    ints = dense_dot_general(jnp.ones((2, 4), jnp.int32), jnp.ones((4, 5), jnp.int32), DENSE(x[0]))
    assert ints.dtype == jnp.int32 and int(ints[0, 0]) == 4


def test_convnet_head_uses_it_and_trains_as_with_the_plain_product():
    model = ConvNet(channels=(4, 8), strides=(2, 2), rngs=nnx.Rngs(0))
    assert model.head.dot_general is dense_dot_general
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((6, 28, 28, 1)), jnp.float32)

    def loss(p, plain: bool):
        m = nnx.merge(graphdef, p, rest, copy=True)
        if plain:
            m.head.dot_general = lax.dot_general
        return jnp.sum(m(x, train=True) ** 2)

    ours, plain = jax.grad(loss)(params, False), jax.grad(loss)(params, True)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(plain)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
