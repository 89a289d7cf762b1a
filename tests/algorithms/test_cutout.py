import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import CutOut, cutout_batch
from jaxcomposer.algorithms.cutout import _hole_mask
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.CutOut(num_holes=1, length=0.5))


def _composer_mask(h, w, y, x, length):
    """Composer's ``_generate_mask`` (numpy slicing on a ones mask), for parity."""
    m = np.ones((h, w))
    y1, y2 = np.clip(y - length // 2, 0, h), np.clip(y + length // 2, 0, h)
    x1, x2 = np.clip(x - length // 2, 0, w), np.clip(x + length // 2, 0, w)
    m[y1:y2, x1:x2] = 0.0
    return m == 0


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_centered_hole_area():
    assert int(_hole_mask(4, 4, 8, 8, 4).sum()) == 16
    assert int(_hole_mask(4, 4, 8, 8, 5).sum()) == 16  # Composer quirk: odd sides cover side - 1 pixels per axis
    assert int(_hole_mask(0, 0, 8, 8, 4).sum()) == 4  # clipped at the border


def test_mask_matches_composer_slicing():
    # Every centre of Composer's widest (uniform_sampling) range, for even, odd, zero and oversized sides.
    for h, w, side in [(8, 8, 4), (7, 5, 3), (6, 9, 5), (5, 5, 0), (4, 6, 9)]:
        ys, xs = np.meshgrid(np.arange(-side // 2, h + side // 2), np.arange(-side // 2, w + side // 2), indexing="ij")
        ys, xs = ys.ravel(), xs.ravel()
        ours = np.asarray(jax.vmap(lambda y, x: _hole_mask(y, x, h, w, side))(jnp.asarray(ys), jnp.asarray(xs)))
        for i, (y, x) in enumerate(zip(ys, xs)):
            np.testing.assert_array_equal(ours[i], _composer_mask(h, w, int(y), int(x), side), err_msg=str((y, x)))


def test_identity_length_zero(key):
    x = jax.random.normal(key, (2, 6, 6, 3))
    np.testing.assert_array_equal(cutout_batch(x, length=0.0, key=key), x)
    np.testing.assert_array_equal(cutout_batch(x, length=0, key=key), x)
    np.testing.assert_array_equal(cutout_batch(x, num_holes=0, key=key), x)


def test_one_mask_for_batch_and_channels(key):
    x = jnp.ones((3, 8, 8, 2))
    out = cutout_batch(x, length=0.5, key=key)  # side int(8 * 0.5) = 4
    zeros = np.asarray(out == 0)
    assert (zeros == zeros[:1, :, :, :1]).all()  # same holes in every image and channel
    assert 0 < zeros[0, :, :, 0].sum() <= 16


def test_length_units(key):
    x = jnp.ones((1, 10, 6, 1))
    # int(min(10, 6) * 0.5) = 3 (odd: covers at most 2x2); an int length is pixels.
    assert int((cutout_batch(x, length=0.5, key=key) == 0).sum()) <= 4
    counts = jax.vmap(lambda k: (cutout_batch(x, length=4, key=k) == 0).sum())(jax.random.split(key, 64))
    assert int(counts.max()) == 16


def test_key_determinism_and_layouts(key):
    x = jax.random.normal(key, (2, 9, 7, 3))
    a = cutout_batch(x, num_holes=2, length=0.4, key=key)
    np.testing.assert_array_equal(a, cutout_batch(x, num_holes=2, length=0.4, key=key))
    assert not np.array_equal(a, cutout_batch(x, num_holes=2, length=0.4, key=jax.random.fold_in(key, 1)))
    nchw = cutout_batch(jnp.transpose(x, (0, 3, 1, 2)), num_holes=2, length=0.4, key=key, data_format="NCHW")
    np.testing.assert_array_equal(jnp.transpose(nchw, (0, 2, 3, 1)), a)
    single = cutout_batch(x[0], num_holes=2, length=0.4, key=key)  # one (H, W, C) image
    np.testing.assert_array_equal(single, a[0])


def test_uniform_sampling_covers_corners_evenly(key):
    x = jnp.ones((1, 8, 8, 1))
    keys = jax.random.split(key, 4000)
    for uniform in (False, True):
        hole = lambda k: cutout_batch(x, length=4, uniform_sampling=uniform, key=k)[0, :, :, 0] == 0
        holes = jax.jit(jax.vmap(hole))(keys)
        p = np.asarray(holes.mean(0))
        if uniform:  # every pixel equally likely: 16 / (8 + 4)^2 ~= 0.111
            np.testing.assert_allclose(p, 16 / 144, atol=0.03)
        else:  # centres inside the image: a corner is covered for 3 of 8 centres per axis, the middle for 4
            np.testing.assert_allclose(p[0, 0], 9 / 64, atol=0.03)
            np.testing.assert_allclose(p[4, 4], 16 / 64, atol=0.03)


def test_errors(key):
    with pytest.raises(ValueError, match="data_format"):
        CutOut(data_format="NWHC")
    with pytest.raises(ValueError, match="length"):
        CutOut(length=1.5)
    with pytest.raises(ValueError, match="num_holes"):
        CutOut(num_holes=-1)
    with pytest.raises(ValueError, match="image"):
        cutout_batch(jnp.ones((4, 4)), key=key)


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = CutOut(num_holes=2, length=0.5, uniform_sampling=True)
    traces = []

    def f(batch, step, k):
        traces.append(1)
        return m.batch(batch, make_ctx(step, k))

    jf = jax.jit(f)
    for i in range(4):
        k = jax.random.fold_in(key, i)
        batch = make_batch(k)
        np.testing.assert_array_equal(jf(batch, i, k)["input"], f(batch, i, k)["input"])
    assert len(traces) == 1 + 4  # one trace for jit; the eager calls run the Python body each time

