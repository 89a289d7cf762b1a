import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch

from jaxcomposer.algorithms import GradientClipping, apply_gradient_clipping
from jaxcomposer.algorithms.gradient_clipping import unitwise_norm
from tests.algorithms.algo_testing import make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.GradientClipping(clipping_type="norm", clipping_threshold=0.1))


def _tree(key, scale=1.0):
    """Flax layout: Dense kernel (in, out), Conv kernel (kh, kw, in, out), bias (out,), a scalar."""
    ks = jax.random.split(key, 4)
    return {"dense": {"kernel": scale * jax.random.normal(ks[0], (6, 4)), "bias": scale * jax.random.normal(ks[1], (4,))},
            "conv": {"kernel": scale * jax.random.normal(ks[2], (3, 3, 2, 5))},
            "scale": scale * jax.random.normal(ks[3], ())}


def _global_norm(t):
    return float(jnp.sqrt(sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(t))))


def _to_torch(t):
    return [torch.tensor(np.asarray(x), requires_grad=True) for x in jax.tree_util.tree_leaves(t)]


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_huge_threshold_is_identity(key):
    g, p = _tree(key), _tree(jax.random.fold_in(key, 1))
    for kind in ("norm", "value", "adaptive"):
        out = apply_gradient_clipping(g, kind, 1e9, params=p)
        jax.tree_util.tree_map(np.testing.assert_array_equal, out, g)


def test_norm_clipping_hits_threshold_and_matches_torch(key):
    g = _tree(key, scale=3.0)
    out = apply_gradient_clipping(g, "norm", 0.5)
    np.testing.assert_allclose(_global_norm(out), 0.5, rtol=1e-5)
    params = _to_torch(g)
    for t, leaf in zip(params, jax.tree_util.tree_leaves(g)):
        t.grad = torch.tensor(np.asarray(leaf))
    torch.nn.utils.clip_grad_norm_(params, max_norm=0.5)
    for t, ours in zip(params, jax.tree_util.tree_leaves(out)):
        np.testing.assert_allclose(ours, t.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_value_clipping_bounds_and_matches_torch(key):
    g = _tree(key, scale=2.0)
    out = apply_gradient_clipping(g, "value", 0.7)
    assert max(float(jnp.abs(x).max()) for x in jax.tree_util.tree_leaves(out)) <= 0.7
    params = _to_torch(g)
    for t, leaf in zip(params, jax.tree_util.tree_leaves(g)):
        t.grad = torch.tensor(np.asarray(leaf))
    torch.nn.utils.clip_grad_value_(params, clip_value=0.7)
    for t, ours in zip(params, jax.tree_util.tree_leaves(out)):
        np.testing.assert_array_equal(ours, t.grad.numpy())


def test_unitwise_norm_layout():
    k = jnp.arange(24.0).reshape(2, 3, 4)  # 4 output units on the last axis
    np.testing.assert_allclose(unitwise_norm(k)[0, 0], jnp.sqrt((k ** 2).sum((0, 1))), rtol=1e-6)
    assert unitwise_norm(k).shape == (1, 1, 4)
    assert unitwise_norm(jnp.array([3.0, 4.0])).shape == ()  # vectors: one norm, as Composer
    np.testing.assert_allclose(unitwise_norm(jnp.array([3.0, 4.0])), 5.0)
    np.testing.assert_allclose(unitwise_norm(k, unit_axis=0)[:, 0, 0], jnp.sqrt((k ** 2).sum((1, 2))), rtol=1e-6)


def test_adaptive_per_unit_bound(key):
    thr = 0.05
    g, p = _tree(key, scale=2.0), _tree(jax.random.fold_in(key, 1))
    out = apply_gradient_clipping(g, "adaptive", thr, params=p)
    for go, gi, w in zip(*(jax.tree_util.tree_leaves(t) for t in (out, g, p))):
        bound = thr * unitwise_norm(w)  # Composer's: no floor on the weight norm by default
        assert bool((unitwise_norm(go) <= bound * (1 + 1e-5)).all())
        untouched = unitwise_norm(gi) <= bound  # units under the bound keep their gradient exactly
        np.testing.assert_array_equal(jnp.where(untouched, go, 0), jnp.where(untouched, gi, 0))


def test_adaptive_default_is_composers_and_eps_keeps_zero_init_units_training():
    g = {"bias": jnp.ones((3,)), "w": jnp.full((2, 3), 2e-4)}
    p = {"bias": jnp.zeros((3,)), "w": jnp.full((2, 3), 1e-4)}  # Flax's default bias init; tiny weights
    # Composer's rule by default (no floor): a zero-norm parameter gets a zero gradient, and a unit whose weight
    # norm is under 1e-3 is clipped to thr * ||W||_u (here 0.1 * 1e-4 * sqrt(2), so g is scaled by 0.05)
    out = apply_gradient_clipping(g, "adaptive", 0.1, p)
    np.testing.assert_array_equal(out["bias"], jnp.zeros(3))
    np.testing.assert_allclose(out["w"], jnp.full((2, 3), 1e-5), rtol=1e-5)
    for name in ("bias", "w"):
        coeff = _composer_agc_coeff(torch.tensor(np.asarray(p[name]).T), torch.tensor(np.asarray(g[name]).T), 0.1)
        np.testing.assert_allclose(out[name], (torch.tensor(np.asarray(g[name]).T) * coeff).numpy().T, rtol=1e-5)
    # eps=1e-3 (the paper's floor, opt-in): the zero-init unit trains, bounded by thr * eps
    floored = apply_gradient_clipping(g, "adaptive", 0.1, p, eps=1e-3)
    np.testing.assert_allclose(floored["bias"], jnp.ones(3) * 1e-4 / jnp.sqrt(3.0), rtol=1e-5)
    # the weight norm 1.4e-4 floored to 1e-3: each unit's gradient norm is clipped to 1e-4, not 1.4e-5
    np.testing.assert_allclose(floored["w"], jnp.full((2, 3), 1e-4 / np.sqrt(2.0)), rtol=1e-5)


def test_adaptive_tx_slot_default_is_composers(key):
    p = {"b": jnp.zeros((3,)), "k": jax.random.normal(key, (4, 3))}
    g = {"b": jnp.ones((3,)), "k": 5.0 * jax.random.normal(jax.random.fold_in(key, 1), (4, 3))}
    for kwargs, expected in (({}, apply_gradient_clipping(g, "adaptive", 0.1, p, eps=0.0)),
                             ({"eps": 1e-3}, apply_gradient_clipping(g, "adaptive", 0.1, p, eps=1e-3))):
        tx = GradientClipping("adaptive", 0.1, **kwargs).tx(optax.sgd(-1.0), make_ctx(0))
        updates, _ = tx.update(g, tx.init(p), p)
        for a, b in zip(jax.tree_util.tree_leaves(updates), jax.tree_util.tree_leaves(expected)):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert not np.any(np.asarray(apply_gradient_clipping(g, "adaptive", 0.1, p)["b"]))  # zero weights: zero grad


def _composer_agc_coeff(weights, grad, thr):
    """Composer's ``_get_clipped_gradient_coeff`` + ``_unitwise_norm`` (torch layout: units on axis 0)."""
    def unitwise(t):
        if t.ndim <= 1:
            return torch.linalg.vector_norm(t, ord=2, dim=0)
        return torch.linalg.vector_norm(t, ord=2, dim=tuple(range(1, t.ndim)), keepdim=True)
    return (unitwise(weights) * thr).div_(unitwise(grad)).nan_to_num_(nan=1.0).clamp_(max=1.0)


def test_adaptive_matches_composer_with_eps_zero(key):
    thr = 0.1
    g, p = _tree(key, scale=2.0), _tree(jax.random.fold_in(key, 1))
    g["dense"]["bias"] = jnp.zeros((4,))  # 0/0 -> NaN -> coefficient 1 in Composer
    ours = apply_gradient_clipping(g, "adaptive", thr, params=p, eps=0.0)
    for go, gi, w in zip(*(jax.tree_util.tree_leaves(t) for t in (ours, g, p))):
        # Flax (..., out) -> torch (out, ...): move the unit axis first.
        to_t = lambda a: torch.tensor(np.moveaxis(np.asarray(a), -1, 0) if a.ndim > 1 else np.asarray(a))
        ref = to_t(gi) * _composer_agc_coeff(to_t(w), to_t(gi), thr)
        np.testing.assert_allclose(np.moveaxis(np.asarray(go), -1, 0) if go.ndim > 1 else go, ref.numpy(),
                                   rtol=1e-5, atol=1e-7)
        # ... and unit_axis=0 on torch-layout arrays gives the same numbers.
        np.testing.assert_allclose(apply_gradient_clipping(to_t(gi).numpy(), "adaptive", thr, to_t(w).numpy(),
                                                           eps=0.0, unit_axis=0), ref.numpy(), rtol=1e-5, atol=1e-7)


def test_errors(key):
    with pytest.raises(ValueError, match="clipping_type"):
        GradientClipping("l2", 1.0)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="clipping_threshold"):
            GradientClipping("norm", bad)
    with pytest.raises(ValueError, match="params"):
        apply_gradient_clipping(_tree(key), "adaptive", 0.1)
    tx = GradientClipping("adaptive", 0.1).tx(optax.sgd(0.1), make_ctx(0))
    p = _tree(key)
    with pytest.raises(ValueError, match="params"):
        tx.update(p, tx.init(p))


def test_tx_slot_clips_before_the_optimizer(key):
    g, p = _tree(key, scale=5.0), _tree(jax.random.fold_in(key, 1))
    for kind in ("norm", "value", "adaptive"):
        tx = GradientClipping(kind, 0.3).tx(optax.sgd(1.0), make_ctx(0))
        updates, _ = tx.update(g, tx.init(p), p)
        expected = jax.tree_util.tree_map(jnp.negative, apply_gradient_clipping(g, kind, 0.3, params=p))
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, expected)


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["norm", "value", "adaptive"])
def test_jit_equals_eager_and_no_retrace(kind, key):
    m = GradientClipping(kind, 0.2)
    p = _tree(key)
    traces = []

    def step(g, state, params, step_idx):
        traces.append(1)
        # as in the Trainer: the tx slot is built inside the step from that step's ctx (a traced clock under jit)
        return m.tx(optax.adam(1e-2), make_ctx(step_idx)).update(g, state, params)

    jstep = jax.jit(step)
    state = m.tx(optax.adam(1e-2), make_ctx(0)._replace(step=0)).init(p)  # host init with the step-0 ctx
    for i in range(4):
        g = _tree(jax.random.fold_in(key, 10 + i), scale=3.0)
        (ju, jstate), (eu, _) = jstep(g, state, p, i), step(g, state, p, i)
        jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), ju, eu)
        state = jstate
    assert len(traces) == 1 + 4  # one trace for jit; the eager calls run the Python body each time
