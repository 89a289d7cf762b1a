import jax
import numpy as np
import pytest
from PIL import Image

from jaxcomposer.algorithms import AugMix, augmix_image
from jaxcomposer.core.method import RunInfo, StepCtx, compose
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD, normalize_images
from tests.algorithms.test_augmentation_primitives import data_ctx, trainer_train_inputs
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.AugMix(severity=3, depth=-1, width=3, alpha=1.0, mean=DIGITS_MEAN,
                                            std=DIGITS_STD))


def _images(seed=0, shape=(6, 12, 12, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


def _constant(value):
    def op(img, level, rng):
        return Image.new(img.mode, img.size, (value,) * len(img.getbands()))
    op.__name__ = f"constant{value}"
    return op


def _counting():
    calls = []

    def op(img, level, rng):
        calls.append(level)
        return img
    return op, calls


def _twin_weights(seed, width, alpha):
    """Composer's first two draws: Dirichlet chain weights, then the Beta mixing weight (float32)."""
    g = np.random.default_rng(seed)
    return g.dirichlet([alpha] * width).astype(np.float32), np.float32(g.beta(alpha, alpha))


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_mixing_formula_hand_checked():
    img = _images(1, (7, 5, 3))
    for seed in range(10):
        # chains that output black: the result is (1 - m) * original, truncated to uint8 as Composer's np.uint8
        w, m = _twin_weights(seed, 3, 1.0)
        out = augmix_image(img, severity=3, depth=2, width=3, augmentation_set=[_constant(0)],
                           rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(out, ((1 - m) * img).astype(np.uint8))
        # chains that output white: (1 - m) * original + m * (sum of the weights) * 255
        comb = np.zeros(img.shape, np.float32)
        for wi in w:
            comb += wi * np.full(img.shape, 255, np.uint8)
        out = augmix_image(img, depth=1, width=3, augmentation_set=[_constant(255)], rng=np.random.default_rng(seed))
        np.testing.assert_array_equal(out, ((1 - m) * img + m * comb).astype(np.uint8))


def test_identity_chains_give_back_the_original():
    # no-op chains: (1 - m) x + m x, so the original up to float32 round-off that truncation can turn into -1
    u = _images(2, (8, 6, 6, 3))
    out = augmix_image(u, augmentation_set=[lambda img, level, rng: img], rng=0)
    d = u.astype(int) - out.astype(int)
    assert set(np.unique(d)) <= {0, 1} and (d == 0).mean() > 0.9


def test_chain_lengths():
    op, calls = _counting()
    augmix_image(_images(3, (200, 4, 4, 1)), severity=7, depth=-1, width=3, augmentation_set=[op], rng=0)
    assert set(calls) == {7.0}  # every operation gets the severity as its level
    # depth -1: each chain draws 1..3 operations, so 3..9 per image, 6 on average
    assert 200 * 3 < len(calls) < 200 * 9 and abs(len(calls) / 200 - 6) < 0.5
    op, calls = _counting()
    augmix_image(_images(3, (10, 4, 4, 1)), depth=2, width=4, augmentation_set=[op], rng=0)
    assert len(calls) == 10 * 4 * 2


def test_small_alpha_mixes_one_side():
    # Beta(a, a) and Dirichlet(a) pile up on the corners as a -> 0: images end up near the original or near one
    # chain's output (here all black), rarely half way
    u = np.full((300, 2, 2, 1), 200, np.uint8)
    out = augmix_image(u, depth=1, width=2, alpha=0.05, augmentation_set=[_constant(0)], rng=0)[:, 0, 0, 0]
    assert ((out < 20) | (out > 180)).mean() > 0.8
    mid = augmix_image(u, depth=1, width=2, alpha=50.0, augmentation_set=[_constant(0)], rng=0)[:, 0, 0, 0]
    assert (abs(mid.astype(int) - 100) < 30).mean() > 0.8  # large alpha: m near 0.5


def test_determinism_and_effect():
    u = _images(4, (12, 10, 10, 3))
    a = augmix_image(u, rng=0)
    np.testing.assert_array_equal(a, augmix_image(u, rng=0))
    assert not np.array_equal(a, augmix_image(u, rng=1))
    assert sum(not np.array_equal(a[i], u[i]) for i in range(len(u))) >= 10
    np.testing.assert_array_equal(augmix_image(u, rng=jax.random.PRNGKey(1)), augmix_image(u, rng=jax.random.key(1)))
    children = np.random.default_rng(0).spawn(12)
    np.testing.assert_array_equal(augmix_image(u[5], rng=children[5]), a[5])
    pil = augmix_image(Image.fromarray(u[5]), rng=np.random.default_rng(0).spawn(12)[5])
    assert isinstance(pil, Image.Image)
    np.testing.assert_array_equal(np.asarray(pil), a[5])


def test_dtype_shape_range_and_layouts():
    u = _images(5, (4, 9, 7, 1))
    n = normalize_images(u, DIGITS_MEAN, DIGITS_STD)
    out = augmix_image(n, rng=2, mean=DIGITS_MEAN, std=DIGITS_STD)
    assert out.shape == n.shape and out.dtype == np.float32
    pixels = (out.astype(np.float64) * DIGITS_STD + DIGITS_MEAN) * 255
    np.testing.assert_allclose(pixels, np.rint(pixels), atol=1e-3)
    np.testing.assert_array_equal(np.rint(pixels).astype(np.uint8), augmix_image(u, rng=2))
    f = augmix_image(u / np.float32(255), rng=2)
    assert f.dtype == np.float32 and f.min() >= 0 and f.max() <= 1
    nchw = augmix_image(u.transpose(0, 3, 1, 2), rng=2, data_format="NCHW")
    np.testing.assert_array_equal(nchw, augmix_image(u, rng=2).transpose(0, 3, 1, 2))


def test_validation():
    for kw, match in [({"severity": 10.5}, "severity"), ({"depth": 0}, "depth"), ({"depth": -2}, "depth"),
                      ({"width": 0}, "width"), ({"alpha": 0.0}, "alpha"), ({"alpha": float("inf")}, "alpha"),
                      ({"augmentation_set": "bogus"}, "augmentation_set"), ({"std": 0.3}, "both mean and std"),
                      ({"data_format": "CHW"}, "data_format")]:
        with pytest.raises(ValueError, match=match):
            AugMix(**kw)
    with pytest.raises(ValueError, match="width"):
        augmix_image(_images(), width=0, rng=0)


# (2) the data slot: same seed -> same batch, other keys untouched, clear errors ---------------------------------

def test_data_slot():
    m = AugMix(mean=DIGITS_MEAN, std=DIGITS_STD)
    assert m.name == "AugMix" and m.data is not None
    assert (m.batch, m.loss, m.grad, m.tx, m.post_step, m.stage) == (None,) * 6
    x = normalize_images(_images(6, (8, 8, 8, 1)), DIGITS_MEAN, DIGITS_STD)
    target = np.arange(8)
    batch = {"input": x, "target": target}
    a = m.data(batch, data_ctx(0))
    assert a["target"] is target and a["input"].dtype == np.float32 and a["input"].shape == x.shape
    np.testing.assert_array_equal(a["input"], m.data(batch, data_ctx(0))["input"])
    assert not np.array_equal(a["input"], m.data(batch, data_ctx(1))["input"])
    c = compose([m])
    run = RunInfo(total_steps=40, steps_per_epoch=10)
    at = lambda epoch: c.apply_data(batch, StepCtx(step=10 * epoch + 3, run=run), (1, epoch, 3))["input"]  # noqa: E731
    np.testing.assert_array_equal(at(2), at(2))
    assert not np.array_equal(at(2), at(3))
    with pytest.raises(ValueError, match="batch of images"):
        m.data({"input": np.zeros((8, 64), np.float32)}, data_ctx(0))
    with pytest.raises(ValueError, match="mean= and std="):  # normalized images without their normalization
        AugMix().data(batch, data_ctx(0))


def test_trainer_feeds_augmented_batches():
    seen, raw, expected = trainer_train_inputs(EXAMPLE.make())
    assert len(seen) == 2
    for s, r, e in zip(seen, raw, expected):
        np.testing.assert_array_equal(s, e)
        assert not np.array_equal(s, r)

