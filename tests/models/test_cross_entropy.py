"""soft_cross_entropy with index targets: torch's values and gradients, a written-out gradient (no scatter), the
logits' dtype for the gradient, and second-order reverse mode."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import torch

from jaxcomposer.loss import index_cross_entropy, soft_cross_entropy

RNG = np.random.default_rng(0)
LOGITS = (RNG.standard_normal((4, 7, 11)) * 3).astype(np.float32)
TARGETS = RNG.integers(0, 11, (4, 7)).astype(np.int32)
WEIGHTS = RNG.standard_normal((4, 7)).astype(np.float32)


def weighted(logits):
    return (soft_cross_entropy(logits, jnp.asarray(TARGETS)) * WEIGHTS).sum()


def test_value_and_gradient_match_torch():
    tx = torch.tensor(LOGITS, requires_grad=True)
    per = torch.nn.functional.cross_entropy(tx.reshape(-1, 11), torch.tensor(TARGETS).long().reshape(-1),
                                            reduction="none").reshape(4, 7)
    (per * torch.tensor(WEIGHTS)).sum().backward()
    np.testing.assert_allclose(soft_cross_entropy(jnp.asarray(LOGITS), jnp.asarray(TARGETS)), per.detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.grad(weighted)(jnp.asarray(LOGITS)), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_gradient_equals_autodiff_of_the_plain_formula():
    def plain(logits):
        logp = jax.nn.log_softmax(logits, -1)
        return (-jnp.take_along_axis(logp, jnp.asarray(TARGETS)[..., None], -1)[..., 0] * WEIGHTS).sum()
    np.testing.assert_allclose(jax.grad(weighted)(jnp.asarray(LOGITS)), jax.grad(plain)(jnp.asarray(LOGITS)),
                               rtol=1e-5, atol=1e-6)


def test_low_precision_logits_get_a_gradient_of_their_dtype_and_float32_loss():
    x = jnp.asarray(LOGITS, jnp.bfloat16)
    assert soft_cross_entropy(x, jnp.asarray(TARGETS)).dtype == jnp.float32
    grad = jax.grad(weighted)(x)
    assert grad.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(grad, np.float32), jax.grad(weighted)(x.astype(jnp.float32)), atol=2e-2)


def test_second_order_reverse_mode_matches_the_plain_formula():
    def plain(logits):
        return (-jnp.take_along_axis(jax.nn.log_softmax(logits, -1), jnp.asarray(TARGETS)[..., None], -1)[..., 0]
                * WEIGHTS).sum()
    x = jnp.asarray(LOGITS)
    ours = jax.grad(lambda v: (jax.grad(weighted)(v) ** 2).sum())(x)
    np.testing.assert_allclose(ours, jax.grad(lambda v: (jax.grad(plain)(v) ** 2).sum())(x), rtol=1e-4, atol=1e-6)


def test_compiled_gradient_is_written_out_without_a_scatter():
    x = jnp.zeros((8, 16, 1000), jnp.bfloat16)
    y = jnp.zeros((8, 16), jnp.int32)
    hlo = jax.jit(jax.grad(lambda v: index_cross_entropy(v, y).mean())).lower(x).compile().as_text()
    assert not re.search(r"\bscatter\(|select-and-scatter\(", hlo)  # the op; test names appear in metadata
