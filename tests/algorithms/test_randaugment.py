import jax
import numpy as np
import pytest
from PIL import Image

from jaxcomposer.algorithms import RandAugment, randaugment_image
from jaxcomposer.algorithms import augmentation_primitives as ap
from jaxcomposer.core.method import StepCtx, compose
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD, normalize_images
from tests.algorithms.test_augmentation_primitives import data_ctx, trainer_train_inputs
from jaxcomposer.data import DIGITS_MEAN, DIGITS_STD
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# host-side (data slot); the contract tests feed digits normalized with these statistics
EXAMPLE = Example(lambda: algorithms.RandAugment(severity=9, depth=2, mean=DIGITS_MEAN, std=DIGITS_STD))


def _images(seed=0, shape=(6, 12, 12, 3)):
    return np.random.default_rng(seed).integers(0, 256, shape).astype(np.uint8)


class _Spy:
    """A custom operation list whose members count their calls and return the image unchanged."""

    def __init__(self, n):
        self.calls = np.zeros(n, int)
        self.ops = [self._op(i) for i in range(n)]

    def _op(self, i):
        def op(img, level, rng):
            self.calls[i] += 1
            return img
        op.__name__ = f"spy{i}"
        return op


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_identity_settings():
    u = _images()
    np.testing.assert_array_equal(randaugment_image(u, depth=0, rng=0), u)
    f = u.astype(np.float32) / np.float32(255)
    np.testing.assert_array_equal(randaugment_image(f, depth=0, rng=0), f)
    # severity 0 with the operations that are exact no-ops there in Composer
    identity_at_zero = [ap.rotate, ap.translate_x, ap.translate_y]
    np.testing.assert_array_equal(randaugment_image(u, severity=0, depth=3, augmentation_set=identity_at_zero, rng=1),
                                  u)


def test_depth_ops_drawn_uniformly_with_replacement():
    spy = _Spy(4)
    randaugment_image(_images(shape=(500, 4, 4, 1)), severity=5, depth=3, augmentation_set=spy.ops, rng=0)
    assert spy.calls.sum() == 500 * 3  # exactly `depth` operations per image
    np.testing.assert_allclose(spy.calls / spy.calls.sum(), 0.25, atol=0.03)


def test_hand_checked_chain():
    # one image, depth 2: the same draws from a twin generator through Composer's operations give the same image
    img = Image.fromarray(_images(1, (10, 10, 3))[0])
    ops = ap.augmentation_sets["all"]
    out = randaugment_image(img, severity=9, depth=2, rng=np.random.default_rng(5))
    twin, expect = np.random.default_rng(5), img
    for _ in range(2):
        expect = ops[twin.integers(len(ops))](expect, 9, twin)
    assert isinstance(out, Image.Image)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(expect))


def test_determinism_and_effect():
    u = _images(2, (16, 10, 10, 3))
    a = randaugment_image(u, rng=0)
    np.testing.assert_array_equal(a, randaugment_image(u, rng=0))
    np.testing.assert_array_equal(a, randaugment_image(u, rng=np.random.default_rng(0)))
    b = randaugment_image(u, rng=1)
    assert not np.array_equal(a, b)
    changed = [not np.array_equal(a[i], u[i]) for i in range(len(u))]
    assert sum(changed) >= 12  # two operations at severity 9 leave few images untouched
    k = randaugment_image(u, rng=jax.random.PRNGKey(0))  # JAX keys work as seeds, as for the in-jit methods
    np.testing.assert_array_equal(k, randaugment_image(u, rng=jax.random.PRNGKey(0)))


def test_dtype_shape_range_preserved():
    u = _images(3, (5, 9, 7, 1))
    for x, kw in [(u, {}), (u.astype(np.float32) / 255, {}), (normalize_images(u, DIGITS_MEAN, DIGITS_STD),
                                                              {"mean": DIGITS_MEAN, "std": DIGITS_STD})]:
        out = randaugment_image(x, rng=3, **kw)
        assert out.shape == x.shape and out.dtype == x.dtype
        if "mean" in kw:  # back on the normalized uint8 grid
            pixels = (out.astype(np.float64) * DIGITS_STD + DIGITS_MEAN) * 255
            np.testing.assert_allclose(pixels, np.rint(pixels), atol=1e-3)
            assert pixels.min() > -0.01 and pixels.max() < 255.01
        elif x.dtype != np.uint8:
            assert out.min() >= 0 and out.max() <= 1
    # the three representations give the same augmented pixels
    as_u8 = randaugment_image(u, rng=3)
    np.testing.assert_array_equal(np.rint(randaugment_image(u / np.float32(255), rng=3) * 255), as_u8)


def test_layouts():
    u = _images(4, (3, 8, 6, 3))
    a = randaugment_image(u, rng=9)
    np.testing.assert_array_equal(randaugment_image(u.transpose(0, 3, 1, 2), rng=9, data_format="NCHW"),
                                  a.transpose(0, 3, 1, 2))
    children = np.random.default_rng(9).spawn(3)
    np.testing.assert_array_equal(randaugment_image(u[1], rng=children[1]), a[1])  # single (H, W, C) image


def test_named_sets_resolve_to_composers_operations(monkeypatch):
    enhancements = {ap.color, ap.contrast, ap.brightness, ap.sharpness}
    assert enhancements.isdisjoint(ap.resolve_augmentation_set("safe", "t"))
    assert enhancements <= set(ap.resolve_augmentation_set("all", "t"))
    # the factory draws from the named set: swap the set for counting no-ops and watch them being called
    spy = _Spy(3)
    monkeypatch.setitem(ap.augmentation_sets, "safe", spy.ops)
    m = RandAugment(depth=2, augmentation_set="safe")
    m.data({"input": _images(5, (10, 6, 6, 3))}, data_ctx(0))
    assert spy.calls.sum() == 20


def test_validation():
    for kw, match in [({"severity": -1}, "severity"), ({"severity": 11}, "severity"), ({"severity": True}, "severity"),
                      ({"depth": -1}, "depth"), ({"depth": 1.5}, "depth"),
                      ({"augmentation_set": "augmentations_all"}, "augmentation_set"),
                      ({"mean": 0.3}, "both mean and std"), ({"mean": 0.3, "std": 0.0}, "std > 0"),
                      ({"data_format": "HWC"}, "data_format")]:
        with pytest.raises(ValueError, match=match):
            RandAugment(**kw)
    with pytest.raises(ValueError, match="severity"):
        randaugment_image(_images(), severity=12, rng=0)
    with pytest.raises(TypeError, match="rng"):
        randaugment_image(_images())


# (2) the data slot: same seed -> same batch, other keys untouched, clear errors ---------------------------------

def test_data_slot():
    m = RandAugment(mean=DIGITS_MEAN, std=DIGITS_STD)
    assert m.name == "RandAugment" and m.data is not None
    assert (m.batch, m.loss, m.grad, m.tx, m.post_step, m.stage) == (None,) * 6  # nothing inside the jitted step
    x = normalize_images(_images(6, (8, 8, 8, 1)), DIGITS_MEAN, DIGITS_STD)
    target = np.arange(8)
    batch = {"input": x, "target": target}
    a = m.data(batch, data_ctx(0))
    assert a["target"] is target and batch["input"] is x and a["input"].dtype == np.float32
    np.testing.assert_array_equal(a["input"], m.data(batch, data_ctx(0))["input"])
    assert not np.array_equal(a["input"], m.data(batch, data_ctx(1))["input"])
    # the Trainer's seeding: (seed, epoch, batch) and the method name
    c = compose([m])
    at = lambda i: c.apply_data(batch, StepCtx(step=i), (7, 0, i))["input"]  # noqa: E731
    np.testing.assert_array_equal(at(3), at(3))
    assert not np.array_equal(at(3), at(4))
    other = RandAugment(input_key="image").data({"image": _images(), "target": target}, data_ctx(0))
    assert other["image"].dtype == np.uint8
    with pytest.raises(ValueError, match="batch of images"):  # flat features are not images
        m.data({"input": np.zeros((8, 64), np.float32)}, data_ctx(0))


def test_trainer_feeds_augmented_batches():
    seen, raw, expected = trainer_train_inputs(EXAMPLE.make())
    assert len(seen) == 2
    for s, r, e in zip(seen, raw, expected):
        np.testing.assert_array_equal(s, e)
        assert not np.array_equal(s, r)

