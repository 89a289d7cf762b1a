import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import CutMix, MixUp, cutmix_batch
from jaxcomposer.algorithms.cutmix import LAMBDA_KEY, TARGET_PERM_KEY, _clipped_box
from jaxcomposer.core.method import MethodConflictError, compose
from jaxcomposer.loss import soft_cross_entropy
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.CutMix(alpha=1.0))


def _loss(outputs, batch):
    return soft_cross_entropy(outputs, batch["target"])


def _composer_box(h, w, cy, cx, cut_h, cut_w):
    """Composer's ``_rand_bbox`` for a given centre (its W/H names swapped back: the first pair slices rows)."""
    return (int(np.clip(cy - cut_h // 2, 0, h)), int(np.clip(cx - cut_w // 2, 0, w)),
            int(np.clip(cy + cut_h // 2, 0, h)), int(np.clip(cx + cut_w // 2, 0, w)))


def _distinct_images(b, h, w, c=1):
    # every pixel of every image distinct, so "changed" means "pasted"
    return jnp.arange(b * h * w * c, dtype=jnp.float32).reshape(b, h, w, c)


def _box_area(bbox):
    r1, c1, r2, c2 = (int(v) for v in bbox)
    return (r2 - r1) * (c2 - c1)


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_hand_checked_paste():
    x = _distinct_images(3, 4, 4)
    y = jnp.array([0, 1, 2])
    perm = jnp.array([2, 0, 1])
    mixed, y_perm, lam, bbox = cutmix_batch(x, y, bbox=(1, 0, 3, 2), indices=perm)  # rows 1:3, cols 0:2
    expected = np.array(x)
    expected[:, 1:3, 0:2] = np.asarray(x)[np.asarray(perm), 1:3, 0:2]
    np.testing.assert_array_equal(mixed, expected)
    np.testing.assert_array_equal(y_perm, [2, 0, 1])
    assert float(lam) == 1 - 4 / 16  # the weight of the original label: the unmixed area
    assert tuple(int(v) for v in bbox) == (1, 0, 3, 2)


def test_box_matches_composer_for_every_centre():
    # Every centre of the widest (uniform_sampling) range, even/odd/zero/oversized cuts, non-square images.
    for h, w, cut_h, cut_w in [(8, 8, 4, 4), (7, 5, 3, 5), (6, 9, 5, 2), (5, 5, 0, 0), (4, 6, 9, 7)]:
        cys, cxs = np.meshgrid(np.arange(-cut_h // 2, h + cut_h // 2), np.arange(-cut_w // 2, w + cut_w // 2),
                               indexing="ij")
        cys, cxs = cys.ravel(), cxs.ravel()
        ours = jax.vmap(lambda cy, cx: jnp.stack(_clipped_box(cy, cx, jnp.int32(cut_h), jnp.int32(cut_w), h, w)))(
            jnp.asarray(cys), jnp.asarray(cxs))
        for i, (cy, cx) in enumerate(zip(cys, cxs)):
            assert tuple(np.asarray(ours[i]).tolist()) == _composer_box(h, w, int(cy), int(cx), cut_h, cut_w)


def test_mask_paste_equals_slice_paste(key):
    x = jax.random.normal(key, (4, 6, 7, 2))
    perm = jnp.array([1, 3, 0, 2])
    for bbox in [(0, 0, 6, 7), (2, 3, 2, 5), (5, 1, 6, 7), (1, 2, 4, 3)]:
        r1, c1, r2, c2 = bbox
        expected = np.array(x)
        expected[:, r1:r2, c1:c2] = np.asarray(x)[np.asarray(perm), r1:r2, c1:c2]
        mixed, _, lam, _ = cutmix_batch(x, jnp.arange(4), bbox=bbox, indices=perm)
        np.testing.assert_array_equal(mixed, expected)
        np.testing.assert_allclose(float(lam), 1 - (r2 - r1) * (c2 - c1) / 42, rtol=1e-6)


def test_lambda_is_adjusted_to_the_clipped_box(key):
    x = _distinct_images(4, 8, 8)
    perm = jnp.array([1, 2, 3, 0])  # no fixed points: every pasted pixel changes
    draw = jax.jit(jax.vmap(lambda k: cutmix_batch(x, jnp.arange(4), indices=perm, key=k)))
    mixed, _, lams, bboxes = draw(jax.random.split(key, 256))
    changed = np.asarray((mixed != x[None]).sum((2, 3, 4)))  # (draws, B)
    bboxes = np.stack([np.asarray(b) for b in bboxes], axis=1)
    for i in range(256):
        area = _box_area(bboxes[i])
        assert (changed[i] == area).all()
        np.testing.assert_allclose(float(lams[i]), 1 - area / 64, rtol=1e-6)
    assert float(lams.min()) >= 0.0 and float(lams.max()) <= 1.0
    # Beta(1, 1) draws a box of mean area fraction 1/2 before clipping; clipping only shrinks it.
    assert 0.5 < float(lams.mean()) < 0.9


def test_alpha_zero_cuts_a_full_size_box(key):
    x = _distinct_images(2, 8, 8)
    draw = jax.jit(jax.vmap(lambda k: jnp.stack(cutmix_batch(x, jnp.arange(2), alpha=0.0, key=k)[3])))
    bboxes = draw(jax.random.split(key, 64))
    r1, c1, r2, c2 = np.asarray(bboxes).T
    # A box of side 8 centred inside the image always reaches a border and covers at least half of each axis.
    assert ((r1 == 0) | (r2 == 8)).all() and ((c1 == 0) | (c2 == 8)).all()
    assert (r2 - r1 >= 4).all() and (c2 - c1 >= 4).all()


def test_length_fixes_the_box_side(key):
    x = _distinct_images(2, 8, 12)
    draw = jax.jit(jax.vmap(lambda k: jnp.stack(cutmix_batch(x, jnp.arange(2), length=0.5, key=k)[3])))
    boxes = np.asarray(draw(jax.random.split(key, 256)))
    heights, widths = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert heights.max() == 4 and widths.max() == 6  # int(0.5 * 8), int(0.5 * 12); clipped ones are smaller
    assert ((heights == 4) & (widths == 6)).mean() > 0.1


def test_uniform_sampling_covers_corners_evenly(key):
    x = jnp.zeros((2, 8, 8, 1))
    keys = jax.random.split(key, 4000)
    for uniform in (False, True):
        def covered(k):
            r1, c1, r2, c2 = cutmix_batch(x, jnp.arange(2), length=0.5, uniform_sampling=uniform, key=k)[3]
            rows, cols = jnp.arange(8)[:, None], jnp.arange(8)[None, :]
            return (rows >= r1) & (rows < r2) & (cols >= c1) & (cols < c2)

        p = np.asarray(jax.jit(jax.vmap(covered))(keys).mean(0))
        if uniform:  # every pixel equally likely: 16 / (8 + 4)^2 ~= 0.111
            np.testing.assert_allclose(p, 16 / 144, atol=0.03)
        else:  # centres inside the image: a corner is covered for 3 of 8 centres per axis, the middle for 4
            np.testing.assert_allclose(p[0, 0], 9 / 64, atol=0.03)
            np.testing.assert_allclose(p[4, 4], 16 / 64, atol=0.03)


def test_key_determinism_layouts_and_dtypes(key):
    x = jax.random.normal(key, (4, 6, 5, 3))
    y = jnp.arange(4)
    nhwc = jax.jit(lambda x, y, k: cutmix_batch(x, y, key=k))
    a = nhwc(x, y, key)
    b = nhwc(x, y, key)
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(u, v)
    c = nhwc(x, y, jax.random.fold_in(key, 1))
    assert not np.array_equal(a[0], c[0])
    assert sorted(np.asarray(a[1]).tolist()) == list(range(4))  # a permutation of the targets
    nchw = jax.jit(lambda x, y, k: cutmix_batch(x, y, key=k, data_format="NCHW"))(jnp.transpose(x, (0, 3, 1, 2)), y,
                                                                                   key)
    np.testing.assert_array_equal(jnp.transpose(nchw[0], (0, 2, 3, 1)), a[0])
    assert float(nchw[2]) == float(a[2])
    ints = (x * 50).astype(jnp.uint8)
    assert jax.eval_shape(nhwc, ints, y, key)[0].dtype == jnp.uint8  # a paste, not a blend: integers stay integers
    assert jax.eval_shape(nhwc, x.astype(jnp.bfloat16), y, key)[0].dtype == jnp.bfloat16


def test_errors(key):
    with pytest.raises(ValueError, match="alpha"):
        CutMix(alpha=-1)
    with pytest.raises(ValueError, match="data_format"):
        CutMix(data_format="HWC")
    x = jnp.zeros((2, 4, 4, 1))
    with pytest.raises(ValueError, match="both length and bbox"):
        cutmix_batch(x, jnp.arange(2), length=0.5, bbox=(0, 0, 1, 1), key=key)
    with pytest.raises(ValueError, match="key"):
        cutmix_batch(x, jnp.arange(2), bbox=(0, 0, 1, 1))
    with pytest.raises(ValueError, match="4 dims"):
        cutmix_batch(jnp.zeros((2, 16)), jnp.arange(2), key=key)


# The Method: batch slot + loss slot --------------------------------------------------------------------------------

def test_batch_slot_and_target_interpolation(key):
    m = CutMix(alpha=1.0)
    batch = make_batch(key, batch_size=6)
    out = jax.jit(lambda b, k: m.batch(b, make_ctx(0, k)))(batch, key)
    draw = jax.jit(lambda x, y, k: cutmix_batch(x, y, key=k))
    expected_x, expected_perm, lam, _ = draw(batch["input"], batch["target"], key)
    np.testing.assert_array_equal(out["input"], expected_x)  # the slot uses the method's own ctx.key
    np.testing.assert_array_equal(out[TARGET_PERM_KEY], expected_perm)
    np.testing.assert_array_equal(out[LAMBDA_KEY], np.full((6,), float(lam), np.float32))
    np.testing.assert_array_equal(out["target"], batch["target"])  # the labels are mixed in the loss, not here
    logits = jax.random.normal(key, (6, 5))
    lam_b = out[LAMBDA_KEY][:, None]
    expected_t = lam_b * jax.nn.one_hot(batch["target"], 5) + (1 - lam_b) * jax.nn.one_hot(expected_perm, 5)
    mixed_loss = m.loss(_loss, make_ctx(0))
    np.testing.assert_allclose(mixed_loss(logits, out), soft_cross_entropy(logits, expected_t), rtol=1e-6)
    # Cross-entropy is linear in the target, so interpolate_loss=True gives the same numbers.
    np.testing.assert_allclose(CutMix(interpolate_loss=True).loss(_loss, make_ctx(0))(logits, out),
                               mixed_loss(logits, out), rtol=1e-5)
    # Per-example keys: splitting along axis 0 (microbatches) gives the same per-example losses.
    parts = [mixed_loss(logits[s], {k: v[s] for k, v in out.items()}) for s in (slice(0, 3), slice(3, 6))]
    np.testing.assert_allclose(jnp.concatenate(parts), mixed_loss(logits, out), rtol=1e-6)


def test_hand_checked_loss_weights():
    # lam = 0.75: the original label keeps weight 0.75 (Composer's convention, the opposite of MixUp's).
    batch = {"input": jnp.zeros((2, 2, 2, 1)), "target": jnp.array([0, 1]), TARGET_PERM_KEY: jnp.array([1, 0]),
             LAMBDA_KEY: jnp.array([0.75, 0.75])}
    seen = []
    CutMix().loss(lambda o, b: (seen.append(b["target"]), jnp.zeros(2))[1], make_ctx(0))(jnp.zeros((2, 3)), batch)
    np.testing.assert_allclose(seen[0], [[0.75, 0.25, 0.0], [0.25, 0.75, 0.0]])


def test_loss_is_identity_without_cutmix_keys(key):
    batch = make_batch(key)
    logits = jax.random.normal(key, (4, 5))
    for interp in (False, True):
        wrapped = CutMix(interpolate_loss=interp).loss(_loss, make_ctx(0))
        np.testing.assert_array_equal(wrapped(logits, batch), _loss(logits, batch))


def test_inner_loss_does_not_see_cutmix_keys(key):
    seen = []
    inner = lambda o, b: (seen.append(sorted(b)), _loss(o, b))[1]
    out = CutMix().batch(make_batch(key), make_ctx(0, key))
    for interp in (False, True):
        CutMix(interpolate_loss=interp).loss(inner, make_ctx(0))(jnp.zeros((4, 5)), out)
    assert len(seen) == 3 and all(not any(k.startswith("cutmix/") for k in keys) for keys in seen)


def test_segmentation_targets_are_pasted(key):
    x = jax.random.normal(key, (4, 6, 6, 2))
    masks = jax.random.randint(key, (4, 6, 6), 0, 3)
    out = CutMix().batch({"input": x, "target": masks}, make_ctx(0, key))
    _, perm_masks, _, bbox = cutmix_batch(x, masks, key=key)
    r1, c1, r2, c2 = (int(v) for v in bbox)
    expected = np.array(masks)
    expected[:, r1:r2, c1:c2] = np.asarray(perm_masks)[:, r1:r2, c1:c2]
    np.testing.assert_array_equal(out["target"], expected)
    assert LAMBDA_KEY not in out  # exact per-pixel labels: nothing left to interpolate in the loss
    with pytest.raises(ValueError, match="interpolate_loss"):
        CutMix(interpolate_loss=True).batch({"input": x, "target": masks}, make_ctx(0, key))


def test_conflicts_with_mixup():
    for pair in ([CutMix(), MixUp()], [MixUp(), CutMix()]):
        with pytest.raises(MethodConflictError, match="interpolate targets"):
            compose(pair)


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = CutMix(alpha=1.0, uniform_sampling=True)
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
        np.testing.assert_array_equal(jo["input"], eo["input"])
        np.testing.assert_array_equal(jo[LAMBDA_KEY], eo[LAMBDA_KEY])
        np.testing.assert_allclose(jl, el, rtol=1e-5)
    assert len(traces) == 1 + 4  # one trace for jit; the eager calls run the Python body each time



def test_area_and_box_come_back_as_composers_python_numbers():
    """Composer's cutmix_batch returns a float area and an int box; a traced call keeps them arrays."""
    import torch

    x = np.random.default_rng(0).random((4, 3, 8, 8)).astype(np.float32)
    y = np.arange(4)
    for xs, ys in ((torch.from_numpy(x), torch.from_numpy(y)), (x.transpose(0, 2, 3, 1).copy(), y)):
        _, _, area, bbox = cutmix_batch(xs, ys, alpha=1.0, key=jax.random.key(1))
        assert type(area) is float and 0.0 <= area <= 1.0
        assert all(type(b) is int for b in bbox)
        r1, c1, r2, c2 = bbox
        assert area == pytest.approx(1 - (r2 - r1) * (c2 - c1) / 64)
    traced = jax.jit(lambda k: cutmix_batch(jnp.asarray(x.transpose(0, 2, 3, 1)), jnp.asarray(y), key=k)[2])(
        jax.random.key(1))
    assert isinstance(traced, jax.Array) and traced.shape == ()
