"""max_pool: torch's max-pool forward and first-maximum gradient, without a scatter in the compiled gradient."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxcomposer.models.pooling import max_pool
from torch_bridge.ops.nn_pool import _window

# (kernel, stride, padding, dilation, ceil_mode): torch's max_pool2d arguments
CASES = [(3, 2, 1, 1, False), (2, 2, 0, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, False), (3, 2, 0, 1, True),
         (2, 3, 1, 1, True)]


@pytest.mark.parametrize("k,s,p,d,ceil", CASES)
def test_matches_torch_forward_and_gradient_with_ties(k, s, p, d, ceil):
    rng = np.random.default_rng(k * 10 + s)
    x = rng.integers(-3, 4, (2, 3, 11, 10)).astype(np.float32)  # small integers: most windows hold ties
    tx = torch.tensor(x, requires_grad=True)
    ty = torch.nn.functional.max_pool2d(tx, k, s, p, d, ceil_mode=ceil)
    g = rng.standard_normal(tuple(ty.shape)).astype(np.float32)
    ty.backward(torch.tensor(g))
    win, strides, pads, dil = _window(jnp.asarray(x), 2, k, s, p, d, ceil)
    y, vjp = jax.vjp(lambda v: max_pool(v, win, strides, pads, dil), jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(y), ty.detach().numpy())
    np.testing.assert_array_equal(np.asarray(vjp(jnp.asarray(g))[0]), tx.grad.numpy())  # same positions, exactly


def test_equals_reduce_window_and_keeps_dtype():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9, 4)), jnp.bfloat16)
    spec = ((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, *spec)
    np.testing.assert_array_equal(np.asarray(max_pool(x, *spec), np.float32), np.asarray(ref, np.float32))
    grad = jax.grad(lambda v: max_pool(v, *spec).astype(jnp.float32).sum())(x)
    assert grad.dtype == jnp.bfloat16 and float(grad.astype(jnp.float32).sum()) == 2 * 5 * 5 * 4  # one per window


def test_nan_propagates_and_takes_the_gradient():
    x = jnp.array([[1.0, jnp.nan, 3.0, 2.0]])
    y, vjp = jax.vjp(lambda v: max_pool(v, (1, 2), (1, 2), ((0, 0), (0, 0))), x)
    assert np.isnan(y[0, 0]) and y[0, 1] == 3.0
    np.testing.assert_array_equal(vjp(jnp.ones_like(y))[0], [[0.0, 1.0, 1.0, 0.0]])


def test_compiled_gradient_has_no_scatter():
    x = jnp.zeros((2, 16, 16, 8), jnp.float32)
    spec = ((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
    hlo = jax.jit(jax.grad(lambda v: max_pool(v, *spec).sum())).lower(x).compile().as_text()
    assert not re.search(r"\bscatter\(|select-and-scatter\(", hlo)  # the op; test names appear in metadata


def test_spec_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="one entry per dim of the 4-d input"):
        max_pool(jnp.zeros((1, 4, 4, 1)), (3, 3), (2, 2), ((1, 1), (1, 1)))


def test_second_order_reverse_mode_matches_reduce_window():
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    spec = ((1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))

    def grad_norm(pool):
        return jax.grad(lambda v: (jax.grad(lambda u: (pool(u) ** 2).sum())(v) ** 2).sum())(x)
    ours = grad_norm(lambda u: max_pool(u, *spec))
    assert float(jnp.abs(ours).sum()) > 0
    np.testing.assert_array_equal(ours, grad_norm(lambda u: jax.lax.reduce_window(u, -jnp.inf, jax.lax.max, *spec)))
