import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomposer.algorithms import ColOut, colout_batch
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# 8x8 images shrink to 6x6: image models only (an MLP's fixed fan-in rejects them)
EXAMPLE = Example(lambda: algorithms.ColOut(p_row=0.15, p_col=0.15))


def _coded_images(b, h, w, c=2):
    """Pixel value encodes (example, row, col, channel), so the kept rows and columns can be read back."""
    n, r, q, k = np.meshgrid(np.arange(b), np.arange(h), np.arange(w), np.arange(c), indexing="ij")
    return jnp.asarray(((n * 100 + r) * 100 + q) * 10 + k, jnp.int32)


def _decode(out):
    out = np.asarray(out)
    return out // 100000, (out // 1000) % 100, (out // 10) % 100, out % 10  # example, row, col, channel


def _jit_colout(**kw):
    return jax.jit(lambda s, k: colout_batch(s, key=k, **kw))


# (1) functional numerics ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("h,w,p_row,p_col,kept_h,kept_w", [
    (8, 8, 0.15, 0.15, 6, 6),      # int(6.8)
    (32, 32, 0.15, 0.05, 27, 30),  # int(27.2), int(30.4)
    (10, 20, 0.1, 0.15, 9, 17),    # int(0.9 * 10), int(0.85 * 20): exact products stay exact
    (224, 224, 0.05, 0.05, 212, 212),  # Composer's hot recipe on ImageNet: int(212.8)
])
def test_kept_counts_match_composer(h, w, p_row, p_col, kept_h, kept_w, key):
    assert int((1 - p_row) * h) == kept_h and int((1 - p_col) * w) == kept_w  # Composer's formula
    out = jax.eval_shape(lambda x, k: colout_batch(x, p_row, p_col, key=k),
                         jax.ShapeDtypeStruct((2, h, w, 3), jnp.float32), key)
    assert out.shape == (2, kept_h, kept_w, 3)


def test_keeps_sorted_rows_and_cols_shared_by_batch_and_channels(key):
    x = _coded_images(3, 8, 10)
    out = _jit_colout(p_row=0.25, p_col=0.4)(x, key)
    assert out.shape == (3, 6, 6, 2)
    n, r, c, ch = _decode(out)
    rows, cols = r[0, :, 0, 0], c[0, 0, :, 0]
    assert (np.diff(rows) > 0).all() and (np.diff(cols) > 0).all()  # distinct survivors, in their original order
    np.testing.assert_array_equal(r, np.broadcast_to(rows[None, :, None, None], r.shape))  # same rows everywhere
    np.testing.assert_array_equal(c, np.broadcast_to(cols[None, None, :, None], c.shape))
    np.testing.assert_array_equal(n, np.broadcast_to(np.arange(3)[:, None, None, None], n.shape))
    np.testing.assert_array_equal(ch, np.broadcast_to(np.arange(2), ch.shape))
    np.testing.assert_array_equal(out, np.asarray(x)[:, rows][:, :, cols])  # a gather, nothing else


def test_identity_and_empty(key):
    x = jax.random.normal(key, (2, 5, 7, 3))
    np.testing.assert_array_equal(colout_batch(x, p_row=0.0, p_col=0.0, key=key), x)
    assert colout_batch(x, p_row=1.0, p_col=0.0, key=key).shape == (2, 0, 7, 3)  # Composer keeps int(0 * H) rows too


def test_every_row_is_eventually_dropped_and_kept(key):
    x = _coded_images(1, 8, 8, 1)
    f = jax.jit(jax.vmap(lambda k: colout_batch(x, 0.25, 0.25, key=k)))
    rows = _decode(f(jax.random.split(key, 400)))[1][:, 0, :, 0, 0]  # (draws, 6)
    freq = np.bincount(rows.ravel(), minlength=8) / 400
    np.testing.assert_allclose(freq, 6 / 8, atol=0.08)  # a uniform choice of 6 of 8 rows


def test_key_determinism_layouts_and_single_images(key):
    x = jax.random.normal(key, (2, 9, 7, 3))
    f = _jit_colout()
    a = f(x, key)
    np.testing.assert_array_equal(a, f(x, key))
    assert not np.array_equal(a, f(x, jax.random.fold_in(key, 1)))
    nchw = _jit_colout(data_format="NCHW")(jnp.transpose(x, (0, 3, 1, 2)), key)
    np.testing.assert_array_equal(jnp.transpose(nchw, (0, 2, 3, 1)), a)
    np.testing.assert_array_equal(f(x[0], key), a[0])  # one (H, W, C) image: the same draw
    assert f(x.astype(jnp.bfloat16), key).dtype == jnp.bfloat16


def test_resize_target(key):
    x = _coded_images(2, 8, 8)
    mask = x[..., 0]  # (B, H, W): a segmentation target with the input's spatial size
    labels = jnp.array([3, 4])
    f_auto = _jit_colout()
    x_out, m_out = f_auto((x, mask), key)
    np.testing.assert_array_equal(m_out, x_out[..., 0])  # the same rows and columns as the input
    np.testing.assert_array_equal(f_auto(x, key), x_out)  # resizing the target does not change the input's draw
    # Composer's return types: a pair only when the target was resized, the input alone otherwise.
    only = f_auto((x, labels), key)
    assert not isinstance(only, tuple) and only.shape == (2, 6, 6, 2)
    one_hot = jax.nn.one_hot(labels, 8)  # (B, C) with C == W: 'auto' needs more than 2 dims, so it is left alone
    assert not isinstance(f_auto((x, one_hot), key), tuple)
    assert not isinstance(_jit_colout(resize_target=False)((x, mask), key), tuple)
    # (B, H, W, K) one-hot masks in NHWC, and (B, K, H, W) in NCHW
    mask_k = jax.nn.one_hot(mask % 3, 3)
    np.testing.assert_array_equal(f_auto((x, mask_k), key)[1], jax.nn.one_hot(x_out[..., 0] % 3, 3))
    _, m_nchw = _jit_colout(data_format="NCHW")((jnp.transpose(x, (0, 3, 1, 2)), jnp.transpose(mask_k, (0, 3, 1, 2))),
                                                key)
    np.testing.assert_array_equal(jnp.transpose(m_nchw, (0, 2, 3, 1)), jax.nn.one_hot(x_out[..., 0] % 3, 3))
    with pytest.raises(ValueError, match="spatial size"):
        colout_batch((x, labels), resize_target=True, key=key)


def test_errors(key):
    for kw in ({"p_row": -0.1}, {"p_col": 1.5}, {"resize_target": "yes"}, {"data_format": "NWHC"},
               {"batch": "per_sample"}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            ColOut(**kw)
    with pytest.raises(ValueError, match="flat feature vectors"):
        colout_batch(jnp.zeros((4, 64)), key=key)
    with pytest.raises(ValueError, match="images only"):
        ColOut().batch({"input": jnp.zeros((4, 64)), "target": jnp.zeros((4,), jnp.int32)}, make_ctx(0, key))


# The Method: batch slot ----------------------------------------------------------------------------------------------

def test_batch_slot(key):
    batch = {"input": _coded_images(4, 8, 8), "target": jnp.arange(4)}
    out = ColOut().batch(batch, make_ctx(0, key))
    np.testing.assert_array_equal(out["input"], colout_batch(batch["input"], key=key))  # its own ctx.key, defaults
    np.testing.assert_array_equal(out["target"], batch["target"])  # labels are not spatial
    seg = {"input": batch["input"], "target": batch["input"][..., 0]}
    out = ColOut().batch(seg, make_ctx(0, key))
    np.testing.assert_array_equal(out["target"], out["input"][..., 0])


def test_per_example_mode(key):
    batch = {"input": _coded_images(6, 8, 8, 1), "target": _coded_images(6, 8, 8, 1)[..., 0]}
    out = jax.jit(lambda b, k: ColOut(p_row=0.25, p_col=0.25, batch=False).batch(b, make_ctx(0, k)))(batch, key)
    assert out["input"].shape == (6, 6, 6, 1)
    n, r, c, _ = _decode(out["input"])
    np.testing.assert_array_equal(n, np.broadcast_to(np.arange(6)[:, None, None, None], n.shape))
    rows = r[:, :, 0, 0]
    assert (np.diff(rows, axis=1) > 0).all()  # each example keeps its rows in order
    assert len({tuple(v) for v in rows}) > 1  # and draws its own
    np.testing.assert_array_equal(out["target"], out["input"][..., 0])  # each target follows its own image


def test_image_model_only_in_the_trainer():
    """ColOut shrinks 8x8 digits to 6x6: a global-pooling ResNet trains on them, the contract MLP (fixed fan-in of
    64) rejects them with its own clear error."""
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits, mlp_task

    trainer = Trainer(model=mlp_task(), train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0),
                      max_duration="1ba", optimizers=DecoupledSGDW(lr=0.1), algorithms=[ColOut()], seed=0,
                      progress_bar=False, devices=jax.devices()[:1])
    with pytest.raises(ValueError, match="36 features, expected in_features=64"):
        trainer.fit()


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    m = ColOut(p_row=0.2, p_col=0.3)
    traces = []

    def f(batch, step, k):
        traces.append(1)
        return m.batch(batch, make_ctx(step, k))

    jf = jax.jit(f)
    for i in range(4):
        k = jax.random.fold_in(key, i)
        batch = make_batch(k)
        j, e = jf(batch, i, k), f(batch, i, k)
        assert j["input"].shape == (4, 6, 5, 3)  # int(0.8 * 8), int(0.7 * 8)
        np.testing.assert_array_equal(j["input"], e["input"])
    assert len(traces) == 1 + 4  # one trace for jit; the eager calls run the Python body each time

