"""The PIL operations RandAugment and AugMix share (Composer's ``augmentation_primitives``) and the host plumbing
that maps them over numpy batches of any dtype, range and layout."""
import jax
import numpy as np
import pytest
from PIL import Image

from jaxcomposer.algorithms import augmentation_primitives as ap
from jaxcomposer.core.method import StepCtx
from jaxcomposer.data import normalize_images

ALL_OPS = ap.augmentation_sets["all"]
ENHANCE = ["color", "contrast", "brightness", "sharpness"]


def _img(a):
    return Image.fromarray(np.asarray(a, np.uint8))


def _random_image(seed, shape):
    return _img(np.random.default_rng(seed).integers(0, 256, shape))


def _level_twin(seed, level):
    """The first draw every random operation makes, re-derived: Composer's U(0.1, level)."""
    g = np.random.default_rng(seed)
    return g, 0.1 + (level - 0.1) * g.random()


# -- the sets -----------------------------------------------------------------------------------------------------

def test_sets_are_composers():
    names = {k: [op.__name__ for op in v] for k, v in ap.augmentation_sets.items()}
    geometric = ["autocontrast", "equalize", "posterize", "rotate", "solarize", "shear_x", "shear_y", "translate_x",
                 "translate_y"]
    assert names["all"] == geometric + ENHANCE
    assert names["safe"] == geometric  # no overlap with the ImageNet-C / CIFAR-10-C corruptions
    assert names["original"] == geometric + [n + "_original" for n in ENHANCE]


def test_resolve_augmentation_set():
    assert ap.resolve_augmentation_set("safe", "x") is ap.augmentation_sets["safe"]
    assert ap.resolve_augmentation_set([ap.rotate], "x") == [ap.rotate]
    with pytest.raises(ValueError, match="augmentation_set must be one of"):
        ap.resolve_augmentation_set("augmentations_all", "x")
    with pytest.raises(ValueError, match="non-empty list"):
        ap.resolve_augmentation_set([], "x")


# -- operations on hand-checked arrays ---------------------------------------------------------------------------

def test_autocontrast_stretches_to_full_range():
    # lo = 0, hi = 51: scale 5 exactly, so 10 -> 50 and 51 -> 255
    out = np.asarray(ap.autocontrast(_img([[0, 10], [51, 51]])))
    np.testing.assert_array_equal(out, [[0, 50], [255, 255]])
    flat = _img(np.full((3, 3), 77))
    np.testing.assert_array_equal(np.asarray(ap.autocontrast(flat)), np.full((3, 3), 77))  # hi <= lo: unchanged
    # per band: each RGB channel is stretched on its own
    rgb = np.stack([np.array([[0, 51]]), np.array([[100, 151]]), np.array([[9, 9]])], -1)
    np.testing.assert_array_equal(np.asarray(ap.autocontrast(_img(rgb))), [[[0, 0, 9], [255, 255, 9]]])


def test_equalize_hand_computed():
    # 1024 pixels: 512 at 0, 256 at 100, 256 at 200. PIL: step = (1024 - 256) // 255 = 3, lut[i] = n // step with
    # n = step // 2 + (pixels below i): 0 -> 0, 100 -> (1 + 512) // 3 = 171, 200 -> (1 + 768) // 3 = 256 -> 255.
    a = np.concatenate([np.zeros(512), np.full(256, 100), np.full(256, 200)]).reshape(32, 32)
    out = np.asarray(ap.equalize(_img(a)))
    np.testing.assert_array_equal(out, np.where(a == 0, 0, np.where(a == 100, 171, 255)))
    two = _img([[0, 255], [0, 255]])  # too few pixels for a step: unchanged
    np.testing.assert_array_equal(np.asarray(ap.equalize(two)), np.asarray(two))


def test_posterize_bits():
    img = _img(np.full((2, 2), 0b10111111))
    for seed in range(20):  # level 0 still keeps only 4 bits (Composer quirk: 4 - int(U(0.1, 0) * 0.4))
        np.testing.assert_array_equal(np.asarray(ap.posterize(img, 0, np.random.default_rng(seed))), 0b10110000)
    for seed in range(20):
        twin, u = _level_twin(seed, 10)
        bits = 4 - int(u * 4 / 10)
        out = np.asarray(ap.posterize(img, 10, np.random.default_rng(seed)))
        np.testing.assert_array_equal(out, 0b10111111 & ~(2 ** (8 - bits) - 1))
        assert 1 <= bits <= 4


def test_solarize_threshold():
    ramp = _img(np.arange(256).reshape(16, 16))
    for seed in range(20):
        _, u = _level_twin(seed, 7)
        threshold = 256 - int(u * 256 / 10)
        out = np.asarray(ap.solarize(ramp, 7, np.random.default_rng(seed))).ravel()
        i = np.arange(256)
        np.testing.assert_array_equal(out, np.where(i < threshold, i, 255 - i))


@pytest.mark.parametrize("op", [ap.translate_x, ap.translate_y])
def test_translate_shifts_whole_pixels(op):
    a = np.random.default_rng(0).integers(1, 256, (30, 30))
    for seed in range(10):
        twin, u = _level_twin(seed, 10)
        t = int(u * 10 / 10) * (-1 if twin.random() > 0.5 else 1)  # a third of 30 pixels at level 10
        out = np.asarray(op(_img(a), 10, np.random.default_rng(seed))).astype(int)
        # output pixel x reads input x + t (PIL's inverse affine map); what falls outside is black
        expect = np.zeros_like(a)
        if op is ap.translate_x:
            src = np.arange(30) + t
            ok = (src >= 0) & (src < 30)
            expect[:, ok] = a[:, src[ok]]
        else:
            src = np.arange(30) + t
            ok = (src >= 0) & (src < 30)
            expect[ok, :] = a[src[ok], :]
        np.testing.assert_array_equal(out, expect)


def test_rotate_degrees_match_composer_mapping():
    img = _random_image(1, (12, 12, 3))
    for seed in range(10):
        twin, u = _level_twin(seed, 9)
        degrees = int(u * 30 / 10) * (-1 if twin.random() > 0.5 else 1)
        out = ap.rotate(img, 9, np.random.default_rng(seed))
        np.testing.assert_array_equal(np.asarray(out),
                                      np.asarray(img.rotate(degrees, resample=Image.Resampling.BILINEAR)))


def test_shear_coefficient():
    img = _random_image(2, (10, 10))
    for op, coeffs in [(ap.shear_x, lambda s: (1, s, 0, 0, 1, 0)), (ap.shear_y, lambda s: (1, 0, 0, s, 1, 0))]:
        twin, u = _level_twin(3, 10)
        s = u * 0.3 / 10 * (-1 if twin.random() > 0.5 else 1)
        expect = img.transform(img.size, Image.Transform.AFFINE, coeffs(s), resample=Image.Resampling.BILINEAR)
        np.testing.assert_array_equal(np.asarray(op(img, 10, np.random.default_rng(3))), np.asarray(expect))
        assert 0.003 <= abs(s) <= 0.3


def test_brightness_damps_increases():
    img = _img(np.full((2, 2), 100))
    seen_up = False
    for seed in range(40):
        twin = np.random.default_rng(seed)
        if twin.random() > 0.5:
            factor = (1 + 8 * twin.random()) * 0.75  # U(1, 9), brightening scaled by 0.75
            seen_up = True
        else:
            factor = (1 - 0.81) + 0.81 * twin.random()  # U(1 - 0.09 * 9, 1)
        out = np.asarray(ap.brightness(img, 9, np.random.default_rng(seed)))
        assert abs(int(out[0, 0]) - min(255, 100 * factor)) <= 1, (seed, factor, out[0, 0])
    assert seen_up


def test_symmetric_and_level_samples():
    g = np.random.default_rng(0)
    sym = np.array([ap._symmetric_sample(10, g) for _ in range(4000)])
    assert sym.min() >= 0.1 and sym.max() <= 10 and abs(np.median(sym) - 1) < 0.1
    levels = np.array([ap._sample_level(5, g) for _ in range(1000)])
    assert levels.min() >= 0.1 and levels.max() < 5
    zero = np.array([ap._sample_level(0, g) for _ in range(1000)])  # severity 0: NumPy's legacy U(0.1, 0)
    assert zero.min() > 0 and zero.max() <= 0.1


@pytest.mark.parametrize("op", [ap.rotate, ap.translate_x, ap.translate_y])
def test_severity_zero_is_identity_where_composers_is(op):
    # rotate: int(U(0.1, 0) * 3) = 0 degrees; translate: int(U * side / 30) = 0 pixels below 300-pixel sides
    for seed, shape in [(0, (9, 7)), (1, (32, 32, 3)), (2, (28, 28))]:
        img = _random_image(seed, shape)
        for s in range(5):
            np.testing.assert_array_equal(np.asarray(op(img, 0, np.random.default_rng(s))), np.asarray(img))


def test_color_is_identity_on_grayscale():
    img = _random_image(4, (8, 8))
    for s in range(5):
        np.testing.assert_array_equal(np.asarray(ap.color(img, 9, np.random.default_rng(s))), np.asarray(img))


@pytest.mark.parametrize("name", sorted(ap.augmentation_sets))
def test_every_op_keeps_mode_and_size(name):
    for shape in [(8, 8), (7, 5, 3)]:
        img = _random_image(5, shape)
        for op in ap.augmentation_sets[name]:
            for level in (0, 3, 10):
                out = op(img, level, np.random.default_rng(level))
                assert out.mode == img.mode and out.size == img.size, (op.__name__, level)


# -- randomness and the numpy plumbing ------------------------------------------------------------------------------

def test_as_generator_accepts_seeds_and_jax_keys():
    draw = lambda r: ap.as_generator(r, "t").random(3)  # noqa: E731
    np.testing.assert_array_equal(draw(5), np.random.default_rng(5).random(3))
    g = np.random.default_rng(1)
    assert ap.as_generator(g, "t") is g
    np.testing.assert_array_equal(draw(jax.random.PRNGKey(3)), draw(jax.random.key(3)))
    assert not np.array_equal(draw(jax.random.PRNGKey(3)), draw(jax.random.PRNGKey(4)))
    with pytest.raises(TypeError, match="pass rng="):
        ap.as_generator(None, "t")
    with pytest.raises(TypeError, match="numpy Generator"):
        ap.as_generator(np.zeros(2, np.float32), "t")


def _identity(img, rng):
    return img


def _invert(img, rng):
    return Image.eval(img, lambda v: 255 - v)


def test_map_images_round_trips_every_dtype_and_range():
    u = np.random.default_rng(0).integers(0, 256, (3, 5, 4, 3)).astype(np.uint8)
    np.testing.assert_array_equal(ap.map_images(_identity, u, 0), u)
    f = u.astype(np.float32) / np.float32(255)
    np.testing.assert_array_equal(ap.map_images(_identity, f, 0), f)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    n = normalize_images(u, mean, std)
    np.testing.assert_array_equal(ap.map_images(_identity, n, 0, mean=mean, std=std), n)  # the loader's exact values
    # an operation that changes pixels: inversion, in each representation
    np.testing.assert_array_equal(ap.map_images(_invert, u, 0), 255 - u)
    np.testing.assert_allclose(ap.map_images(_invert, f, 0), 1 - f, atol=1e-6)
    inv = ap.map_images(_invert, n, 0, mean=mean, std=std)
    assert inv.dtype == np.float32
    np.testing.assert_array_equal(inv, normalize_images(255 - u, mean, std))


def test_map_images_layouts_and_single_images():
    u = np.random.default_rng(1).integers(0, 256, (4, 6, 5, 1)).astype(np.uint8)
    flip = lambda img, rng: img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)  # noqa: E731
    out = ap.map_images(flip, u, 0)
    np.testing.assert_array_equal(out, u[:, :, ::-1])
    nchw = ap.map_images(flip, u.transpose(0, 3, 1, 2), 0, data_format="NCHW")
    np.testing.assert_array_equal(nchw, out.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(ap.map_images(flip, u[0, :, :, 0], 0), u[0, :, ::-1, 0])  # (H, W)
    np.testing.assert_array_equal(ap.map_images(flip, u[0], 0), u[0, :, ::-1])  # (H, W, C)
    pil = ap.map_images(flip, _img(u[0, :, :, 0]), 0)
    assert isinstance(pil, Image.Image)


def test_batch_images_use_spawned_children():
    noisy = lambda img, rng: Image.fromarray(  # noqa: E731
        (np.asarray(img).astype(int) + rng.integers(0, 50, np.asarray(img).shape)).clip(0, 255).astype(np.uint8))
    u = np.random.default_rng(2).integers(0, 200, (4, 3, 3, 3)).astype(np.uint8)
    out = ap.map_images(noisy, u, 7)
    children = np.random.default_rng(7).spawn(4)
    for i in range(4):
        np.testing.assert_array_equal(out[i], ap.map_images(noisy, u[i], children[i]))
    # an image's result depends on its index only, not on the rest of the batch
    np.testing.assert_array_equal(ap.map_images(noisy, u[:2], 7), out[:2])


def test_map_images_rejects_what_is_not_an_image():
    with pytest.raises(ValueError, match="1 \\(grayscale\\) or 3 \\(RGB\\) channels"):
        ap.map_images(_identity, np.zeros((2, 8, 8, 2), np.uint8), 0)
    with pytest.raises(ValueError, match="expected an image"):
        ap.map_images(_identity, np.zeros((2, 2, 2, 2, 3), np.uint8), 0)
    with pytest.raises(ValueError, match="must be in \\[0, 1\\].*mean= and std="):
        ap.map_images(_identity, np.full((1, 2, 2, 1), -0.5, np.float32), 0)
    with pytest.raises(ValueError, match="uint8 pixels or floats"):
        ap.map_images(_identity, np.zeros((1, 2, 2, 1), np.int32), 0)
    with pytest.raises(ValueError, match="NaN or inf"):
        ap.map_images(_identity, np.full((1, 2, 2, 1), np.nan, np.float32), 0)
    with pytest.raises(ValueError, match="both mean and std"):
        ap.map_images(_identity, np.zeros((1, 2, 2, 1), np.float32), 0, mean=0.5)
    with pytest.raises(ValueError, match="std has 2 values but the images have 3 channels"):
        ap.map_images(_identity, np.zeros((1, 2, 2, 3), np.float32), 0, mean=0.5, std=(1.0, 1.0))
    with pytest.raises(ValueError, match="data_format"):
        ap.map_images(_identity, np.zeros((1, 2, 2, 3), np.uint8), 0, data_format="HWC")
    # half a uint8 step of round-off past [0, 1] is still an image
    edge = np.array([-1e-4, 1 + 1e-4], np.float32).reshape(1, 1, 2, 1)
    np.testing.assert_array_equal(ap.map_images(_identity, edge, 0), [[[[0.0], [1.0]]]])


def data_ctx(rng, step: int = 0) -> StepCtx:
    """The ctx a host ``data`` slot sees: ``key`` is the batch's numpy Generator, ``step`` the global batch index."""
    return StepCtx(step=step, key=rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng))


def test_image_data_fn_errors_are_clear():
    fn = ap.image_data_fn("RandAugment", _identity, "input", "NHWC", None, None)
    with pytest.raises(ValueError, match="must be a batch of images \\(N, H, W, C\\).*got shape \\(4, 64\\)"):
        fn({"input": np.zeros((4, 64), np.float32)}, data_ctx(0))
    with pytest.raises(KeyError, match="no 'input' entry"):
        fn({"x": np.zeros((4, 8, 8, 1), np.float32)}, data_ctx(0))


def test_image_data_fn_draws_from_ctx_key():
    noisy = lambda img, rng: Image.fromarray(  # noqa: E731
        (np.asarray(img).astype(int) + rng.integers(0, 50, np.asarray(img).shape)).clip(0, 255).astype(np.uint8))
    fn = ap.image_data_fn("RandAugment", noisy, "input", "NHWC", None, None)
    u = np.random.default_rng(3).integers(0, 200, (4, 3, 3, 3)).astype(np.uint8)
    out = fn({"input": u}, data_ctx(np.random.default_rng(5), step=9))["input"]
    np.testing.assert_array_equal(out, ap.map_images(noisy, u, np.random.default_rng(5)))  # the key, not the step
    np.testing.assert_array_equal(out, fn({"input": u}, data_ctx(np.random.default_rng(5), step=0))["input"])


# -- shared by test_randaugment and test_augmix: what the Trainer feeds its step ----------------------------------

def trainer_train_inputs(method, steps: int = 2, seed: int = 7):
    """Run ``steps`` Trainer steps with ``method`` and a spy listed after it; return (what the spy saw, the raw
    loader batches, the batches ``compose([method]).apply_data`` gives for the Trainer's seed parts)."""
    from flax import nnx

    from jaxcomposer import Trainer
    from jaxcomposer.core.method import Method, compose
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import MLP
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    seen, clock = [], []
    spy = Method(name="Spy", data=lambda b, ctx: (seen.append(np.array(b["input"])), clock.append(ctx.step), b)[2])
    data = digits("train", n=64)
    trainer = Trainer(model=ComposerClassifier(MLP(64, hidden=(8,), num_classes=10, rngs=nnx.Rngs(0)),
                                               num_classes=10),
                      train_dataloader=ArrayLoader(data, 32, seed=3), max_duration=f"{steps}ba",
                      optimizers=DecoupledSGDW(lr=0.1), algorithms=[method, spy], seed=seed, progress_bar=False,
                      devices=jax.devices()[:1])
    trainer.fit()
    raw = [dict(b) for _, b in zip(range(steps), ArrayLoader(data, 32, seed=3))]
    assert clock == list(range(steps))  # the data slot's ctx.step is the global batch index
    expected = [compose([method]).apply_data(dict(b), StepCtx(step=i), (seed, 0, i))["input"]
                for i, b in enumerate(raw)]
    return seen, [b["input"] for b in raw], expected
