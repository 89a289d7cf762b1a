import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import MixUp, mixup_batch
from jaxcomposer.algorithms.mixup import MIXING_KEY, TARGET_PERM_KEY
from jaxcomposer.algorithms.sampling import symmetric_beta
from jaxcomposer.core.method import Method, MethodConflictError, compose
from jaxcomposer.loss import soft_cross_entropy
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.MixUp(alpha=0.2))


def _loss(outputs, batch):
    return soft_cross_entropy(outputs, batch["target"])


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_hand_checked_mix():
    x = jnp.array([[0.0], [10.0], [20.0]])
    y = jnp.array([0, 1, 2])
    mixed, y_perm, lam = mixup_batch(x, y, mixing=0.25, indices=jnp.array([2, 0, 1]))
    np.testing.assert_allclose(mixed, [[5.0], [7.5], [17.5]], rtol=1e-6)  # 0.75 * x + 0.25 * x[perm]
    np.testing.assert_array_equal(y_perm, [2, 0, 1])
    assert float(lam) == 0.25


def test_mixing_comes_back_as_composers_python_float(key):
    """Composer returns the float it drew or was given; a 0-d array only where the call is traced."""
    import torch

    x, y = np.arange(12.0, dtype=np.float32).reshape(4, 3), np.arange(4)
    perm = np.array([1, 2, 3, 0])
    for xs, ys, ps in ((x, y, perm), (jnp.asarray(x), jnp.asarray(y), jnp.asarray(perm)),
                       (torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(perm))):
        mixed, _, given = mixup_batch(xs, ys, 0.3, indices=ps)
        assert type(given) is float and given == pytest.approx(0.3), type(xs)
        np.testing.assert_allclose(np.asarray(mixed), 0.7 * x + 0.3 * x[perm], rtol=1e-6)
        _, _, drawn = mixup_batch(xs, ys, alpha=1.0, key=key)
        assert type(drawn) is float and 0.0 <= drawn <= 0.5, type(xs)
    assert mixup_batch(x, y, alpha=1.0, key=key)[2] == mixup_batch(jnp.asarray(x), jnp.asarray(y), alpha=1.0,
                                                                   key=key)[2]
    traced = jax.jit(lambda k: mixup_batch(jnp.asarray(x), jnp.asarray(y), alpha=1.0, key=k)[2])(key)
    assert isinstance(traced, jax.Array) and traced.shape == () and float(traced) == pytest.approx(
        mixup_batch(x, y, alpha=1.0, key=key)[2])


def test_alpha_zero_is_identity(key):
    x = jax.random.normal(key, (4, 3, 3, 2))
    mixed, _, lam = mixup_batch(x, jnp.arange(4), alpha=0.0, key=key)
    assert float(lam) == 0.0
    np.testing.assert_array_equal(mixed, x)


def test_lambda_at_most_half_and_key_determinism(key):
    x = jnp.arange(8.0).reshape(8, 1)
    draw = jax.jit(jax.vmap(lambda k: mixup_batch(x, jnp.arange(8), alpha=1.0, key=k)[2]))
    lams = draw(jax.random.split(key, 512))
    assert float(lams.max()) <= 0.5 and float(lams.min()) >= 0.0
    assert float(lams.mean()) > 0.15  # Beta(1, 1) folded: mean 0.25, not stuck at 0
    a = mixup_batch(x, jnp.arange(8), key=key)
    b = mixup_batch(x, jnp.arange(8), key=key)
    c = mixup_batch(x, jnp.arange(8), key=jax.random.fold_in(key, 1))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])
    assert sorted(np.asarray(a[1]).tolist()) == list(range(8))  # a permutation


def test_symmetric_beta_is_distributed_as_beta(key):
    """MixUp's and CutMix's draw (one loggamma pair, not jax.random.beta's two loops): the Beta(a, a) moments, and
    deciles within 0.01 of the exact ones (scipy's) on 40,000 draws, for a small, a flat and a peaked alpha (one
    compile: alpha is an argument)."""
    from scipy import stats

    draw = jax.jit(jax.vmap(symmetric_beta, in_axes=(0, None)))
    keys = jax.random.split(key, 40_000)
    deciles = np.linspace(0.1, 0.9, 9)
    for alpha in (0.2, 1.0, 4.0):
        ours = np.asarray(draw(keys, np.float32(alpha)))
        assert ours.dtype == np.float32 and np.all((ours >= 0) & (ours <= 1)), alpha
        assert abs(ours.mean() - 0.5) < 0.01 and abs(ours.var() / (1 / (4 * (2 * alpha + 1))) - 1) < 0.03, alpha
        np.testing.assert_allclose(np.quantile(ours, deciles), stats.beta.ppf(deciles, alpha, alpha), atol=0.01,
                                   err_msg=alpha)


def test_layout_agnostic(key):
    x = jax.random.normal(key, (4, 5, 6, 3))
    nhwc = mixup_batch(x, jnp.arange(4), key=key)[0]
    nchw = mixup_batch(jnp.transpose(x, (0, 3, 1, 2)), jnp.arange(4), key=key)[0]
    np.testing.assert_allclose(jnp.transpose(nchw, (0, 2, 3, 1)), nhwc, rtol=1e-6)


def test_bf16_stays_bf16(key):
    x = jax.random.normal(key, (4, 2)).astype(jnp.bfloat16)
    assert mixup_batch(x, jnp.arange(4), key=key)[0].dtype == jnp.bfloat16


def test_errors(key):
    with pytest.raises(ValueError, match="alpha"):
        MixUp(alpha=-1)
    with pytest.raises(ValueError, match="key"):
        mixup_batch(jnp.zeros((2, 1)), jnp.arange(2))


def test_batch_slot_and_target_interpolation(key):
    m = MixUp(alpha=1.0)
    batch = make_batch(key, batch_size=6)
    out = m.batch(batch, make_ctx(0, key))
    assert out[MIXING_KEY].shape == (6,) and out[TARGET_PERM_KEY].shape == (6,)
    np.testing.assert_array_equal(out["target"], batch["target"])  # the labels are mixed in the loss, not here
    lam = out[MIXING_KEY]
    mixed_loss = m.loss(_loss, make_ctx(0))
    logits = jax.random.normal(key, (6, 5))
    expected_t = ((1 - lam)[:, None] * jax.nn.one_hot(batch["target"], 5)
                  + lam[:, None] * jax.nn.one_hot(out[TARGET_PERM_KEY], 5))
    np.testing.assert_allclose(mixed_loss(logits, out), soft_cross_entropy(logits, expected_t), rtol=1e-6)
    # Cross-entropy is linear in the target, so interpolate_loss=True gives the same numbers.
    np.testing.assert_allclose(MixUp(alpha=1.0, interpolate_loss=True).loss(_loss, make_ctx(0))(logits, out),
                               mixed_loss(logits, out), rtol=1e-5)
    # Per-example keys: splitting along axis 0 (microbatches) gives the same per-example losses.
    halves = [{k: v[s] for k, v in out.items()} for s in (slice(0, 3), slice(3, 6))]
    parts = [mixed_loss(logits[s], h) for s, h in zip((slice(0, 3), slice(3, 6)), halves)]
    np.testing.assert_allclose(jnp.concatenate(parts), mixed_loss(logits, out), rtol=1e-6)


def test_loss_is_identity_without_mixup_keys(key):
    batch = make_batch(key)
    logits = jax.random.normal(key, (4, 5))
    for interp in (False, True):
        wrapped = MixUp(interpolate_loss=interp).loss(_loss, make_ctx(0))
        np.testing.assert_array_equal(wrapped(logits, batch), _loss(logits, batch))


def test_inner_loss_does_not_see_mixup_keys(key):
    seen = []
    inner = lambda o, b: (seen.append(sorted(b)), _loss(o, b))[1]
    out = MixUp().batch(make_batch(key), make_ctx(0, key))
    MixUp(interpolate_loss=True).loss(inner, make_ctx(0))(jnp.zeros((4, 5)), out)
    assert seen and all(not any(k.startswith("mixup/") for k in keys) for keys in seen)


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = MixUp(alpha=0.4)
    traces = []

    def step(batch, step_idx, k):
        traces.append(1)
        out = m.batch(batch, make_ctx(step_idx, k))
        logits = out["input"].reshape(out["input"].shape[0], -1)[:, :5]
        return out, m.loss(_loss, make_ctx(0))(logits, out)

    jstep = jax.jit(step)
    for i in range(4):
        k = jax.random.fold_in(key, i)
        batch = make_batch(k)
        (jo, jl), (eo, el) = jstep(batch, i, k), step(batch, i, k)
        np.testing.assert_allclose(jo["input"], eo["input"], rtol=1e-6, atol=1e-6)  # XLA fuses to FMAs
        np.testing.assert_allclose(jl, el, rtol=1e-5)
    assert len(traces) == 1 + 4  # one trace for jit; the eager calls run the Python body each time


# (5) composition (pairwise: test_composition.py) ---------------------------------------------------------------

def test_conflicts_with_other_target_interpolation():
    with pytest.raises(MethodConflictError, match="interpolate targets"):
        compose([MixUp(), Method(name="x", exclusive={"interpolates_targets"})])
