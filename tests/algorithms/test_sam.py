import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import SAM, apply_sam
from tests.algorithms.algo_testing import make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# interval=2: a plain step, then a SAM step, so two Trainer steps cover both branches
EXAMPLE = Example(lambda: algorithms.SAM(rho=0.5, interval=2))

# A quadratic per example: L_i(w) = 0.5 * sum_leaves a_i * (w - c_i)^2, so grad L(w) = mean_i a_i * (w - c_i).
A = np.array([1.0, 3.0, 0.5])
C = {"u": np.array([[1.0, -2.0], [0.5, 0.0], [-1.0, 4.0]]), "v": np.array([[3.0], [-1.0], [2.0]])}


def _quadratic_grad_fn(calls=None):
    """``grad_fn`` on the quadratic; model state counts passes and remembers the weights each pass saw."""
    def mean_loss(params, batch):
        a = batch["a"]
        per = sum(0.5 * a * jnp.sum((params[k][None, :] - batch[k]) ** 2, axis=1) for k in ("u", "v"))
        return per.mean()

    def grad_fn(params, model_state, batch, key):
        if calls is not None:
            calls.append(key)
        loss, grads = jax.value_and_grad(mean_loss)(params, batch)
        return (loss, {"passes": model_state["passes"] + 1, "seen_u": params["u"]}), grads

    return grad_fn


def _batch():
    return {"a": jnp.asarray(A, jnp.float32), "u": jnp.asarray(C["u"], jnp.float32),
            "v": jnp.asarray(C["v"], jnp.float32)}


def _hand_grad(w):
    return {k: (A[:, None] * (w[k][None, :] - C[k])).mean(0) for k in ("u", "v")}


def _hand_sam(w, rho, eps):
    g = _hand_grad(w)
    norm = np.sqrt(sum((x ** 2).sum() for x in g.values()))
    e = {k: rho * g[k] / (norm + eps) for k in g}
    return _hand_grad({k: w[k] + e[k] for k in w}), e


W = {"u": np.array([0.3, -0.7]), "v": np.array([1.5])}
STATE = {"passes": jnp.zeros((), jnp.int32), "seen_u": jnp.zeros((2,))}


def _params():
    return {k: jnp.asarray(v, jnp.float32) for k, v in W.items()}


# (1) functional numerics ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("rho", [0.05, 0.5, 2.0])
def test_two_pass_gradient_on_a_quadratic(rho, key):
    (loss, state), grads = apply_sam(_quadratic_grad_fn(), rho=rho)(_params(), STATE, _batch(), key)
    expected, e = _hand_sam(W, rho, 1e-12)
    for k in W:
        np.testing.assert_allclose(grads[k], expected[k], rtol=1e-5, atol=1e-6)
    # reported loss: the first pass's, at w
    plain_loss = np.mean(sum(0.5 * A * ((W[k][None, :] - C[k]) ** 2).sum(1) for k in W))
    np.testing.assert_allclose(loss, plain_loss, rtol=1e-6)
    # model state: both passes ran, and the returned state is the second pass's (it saw w + e)
    assert int(state["passes"]) == 2
    np.testing.assert_allclose(state["seen_u"], W["u"] + e["u"], rtol=1e-6)
    # the ascent has length rho (global norm over both leaves)
    np.testing.assert_allclose(np.sqrt(sum((x ** 2).sum() for x in e.values())), rho, rtol=1e-6)


def test_rho_zero_is_the_plain_gradient_and_params_are_untouched(key):
    params = _params()
    (_, _), grads = apply_sam(_quadratic_grad_fn(), rho=0.0)(params, STATE, _batch(), key)
    (_, _), plain = _quadratic_grad_fn()(params, STATE, _batch(), key)
    for k in W:
        np.testing.assert_array_equal(grads[k], plain[k])
        np.testing.assert_array_equal(params[k], W[k].astype(np.float32))  # w itself is never modified


def test_zero_gradient_stays_finite(key):
    at_min = {"u": jnp.zeros((2,)), "v": jnp.zeros((1,))}
    batch = {"a": jnp.ones((3,)), "u": jnp.zeros((3, 2)), "v": jnp.zeros((3, 1))}
    (_, _), grads = apply_sam(_quadratic_grad_fn())(at_min, STATE, batch, key)
    for g in grads.values():
        np.testing.assert_array_equal(g, 0.0)  # epsilon keeps 0 / 0 out


def test_second_pass_draws_its_own_randomness(key):
    calls = []
    apply_sam(_quadratic_grad_fn(calls))(_params(), STATE, _batch(), key)
    assert len(calls) == 2
    np.testing.assert_array_equal(calls[0], key)  # the first pass is exactly a plain step's
    assert not np.array_equal(calls[1], calls[0])


def test_bf16_params_keep_their_dtype(key):
    params = {k: v.astype(jnp.bfloat16) for k, v in _params().items()}

    def grad_fn(p, s, b, k):
        return _quadratic_grad_fn()({n: x.astype(jnp.float32) for n, x in p.items()}, s, b, k)

    seen = []
    wrapped = lambda p, s, b, k: (seen.append({n: x.dtype for n, x in p.items()}), grad_fn(p, s, b, k))[1]
    apply_sam(wrapped)(params, STATE, _batch(), key)
    assert seen[1] == {"u": jnp.bfloat16, "v": jnp.bfloat16}


def test_interval_runs_sam_on_every_interval_th_step(key):
    m = SAM(rho=0.5, interval=3)
    expected_sam, _ = _hand_sam(W, 0.5, 1e-12)
    plain = _hand_grad(W)
    for step in range(7):
        (_, state), grads = m.grad(_quadratic_grad_fn(), make_ctx(step, key))(_params(), STATE, _batch(), key)
        sam_step = (step + 1) % 3 == 0  # steps 2 and 5, as Composer's (global_step + 1) % interval == 0
        expected = expected_sam if sam_step else plain
        assert int(state["passes"]) == (2 if sam_step else 1)
        for k in W:
            np.testing.assert_allclose(grads[k], expected[k], rtol=1e-5, atol=1e-6)


def test_errors():
    for kwargs, match in (({"rho": -0.1}, "rho"), ({"epsilon": -1.0}, "epsilon"), ({"interval": 0}, "interval"),
                          ({"interval": 1.5}, "interval"), ({"interval": True}, "interval")):
        with pytest.raises(ValueError, match=match):
            SAM(**kwargs)
    with pytest.raises(ValueError, match="rho"):
        apply_sam(_quadratic_grad_fn(), rho=-1.0)


# (2) jit == eager, no retrace across steps -----------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = SAM(rho=0.3, interval=2)
    traces = []

    def step(params, step_idx):
        traces.append(1)
        (loss, state), grads = m.grad(_quadratic_grad_fn(), make_ctx(step_idx, key))(params, STATE, _batch(), key)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss, state["passes"]

    jstep = jax.jit(step)
    pj = pe = _params()
    for i in range(5):
        pj, lj, nj = jstep(pj, i)
        pe, le, ne = step(pe, i)
        np.testing.assert_allclose(lj, le, rtol=1e-6)
        for k in W:
            np.testing.assert_allclose(pj[k], pe[k], rtol=1e-5, atol=1e-6)
        assert int(nj) == int(ne) == (2 if i % 2 == 1 else 1)
    assert len(traces) == 1 + 5  # one trace serves plain and SAM steps (lax.cond on the traced step)

