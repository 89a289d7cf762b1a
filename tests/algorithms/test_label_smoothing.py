import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from tests.algorithms.algo_testing import make_ctx
from jaxcomposer.algorithms import LabelSmoothing, smooth_labels
from jaxcomposer.core.method import ModelView
from jaxcomposer.loss import soft_cross_entropy
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
EXAMPLE = Example(lambda: algorithms.LabelSmoothing(smoothing=0.1))


def _loss(outputs, batch):
    return soft_cross_entropy(outputs, batch["target"])


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_hand_checked_values():
    logits = jnp.zeros((2, 4))
    out = smooth_labels(logits, jnp.array([0, 3]), smoothing=0.2)
    expected = np.array([[0.85, 0.05, 0.05, 0.05], [0.05, 0.05, 0.05, 0.85]])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_identity_and_sum_to_one(key):
    logits = jax.random.normal(key, (6, 7))
    y = jnp.arange(6) % 7
    np.testing.assert_array_equal(smooth_labels(logits, y, 0.0), jax.nn.one_hot(y, 7))
    for s in (0.0, 0.1, 0.5, 0.9):
        np.testing.assert_allclose(smooth_labels(logits, y, s).sum(-1), 1.0, rtol=1e-6)


def test_dense_targets_pass_through(key):
    t = jax.nn.softmax(jax.random.normal(key, (3, 4)))
    np.testing.assert_allclose(smooth_labels(jnp.zeros((3, 4)), t, 0.1), 0.9 * t + 0.025, rtol=1e-6)


def test_spatial_targets():
    # Segmentation layout: logits (B, H, W, C), index targets (B, H, W); class axis last.
    out = smooth_labels(jnp.zeros((1, 2, 2, 3)), jnp.zeros((1, 2, 2), jnp.int32), 0.3)
    assert out.shape == (1, 2, 2, 3)
    np.testing.assert_allclose(out[..., 0], 0.8, rtol=1e-6)


def _composer_smoothed_nchw(y: torch.Tensor, n_classes: int, s: float) -> torch.Tensor:
    # Composer's ensure_targets_one_hot puts the one-hot of (N, H, W) targets on dim 1
    return torch.nn.functional.one_hot(y, n_classes).permute(0, 3, 1, 2).float() * (1 - s) + s / n_classes


def test_torch_nchw_segmentation_targets_smooth_along_axis_1():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(2, 4, 3, 5, generator=g), torch.randint(0, 4, (2, 3, 5), generator=g)
    got = smooth_labels(logits, y, 0.1)  # torch tensors: Composer's layout, classes on axis 1
    assert isinstance(got, torch.Tensor) and got.shape == (2, 4, 3, 5)
    torch.testing.assert_close(got, _composer_smoothed_nchw(y, 4, 0.1), rtol=1e-6, atol=1e-7)
    # JAX arrays told the layout give the same targets; by default (NHWC) the class axis is the last one
    nchw = smooth_labels(jnp.asarray(logits.numpy()), jnp.asarray(y.numpy()), 0.1, data_format="NCHW")
    np.testing.assert_allclose(nchw, got.numpy(), rtol=1e-6)
    nhwc = smooth_labels(jnp.moveaxis(jnp.asarray(logits.numpy()), 1, -1), jnp.asarray(y.numpy()), 0.1)
    np.testing.assert_allclose(nhwc, np.moveaxis(got.numpy(), 1, -1), rtol=1e-6)


def test_loss_wrapper_follows_the_models_layout(key):
    logits = jax.random.normal(key, (2, 4, 3, 5))  # (N, C, H, W): a bridged torch model's outputs
    y = jax.random.randint(jax.random.fold_in(key, 1), (2, 3, 5), 0, 4)
    seen = []
    inner = lambda o, b: (seen.append(b["target"]), jnp.zeros((o.shape[0],)))[1]
    LabelSmoothing(0.1).loss(inner, make_ctx(0, model=ModelView(param_layout="torch")))(logits, {"target": y})
    expected = _composer_smoothed_nchw(torch.from_numpy(np.array(y)).long(), 4, 0.1).numpy()
    np.testing.assert_allclose(seen[-1], expected, rtol=1e-6)
    nhwc = jnp.moveaxis(logits, 1, -1)  # a JAX model's (N, H, W, C) outputs: classes last
    LabelSmoothing(0.1).loss(inner, make_ctx(0))(nhwc, {"target": y})
    np.testing.assert_allclose(seen[-1], np.moveaxis(expected, 1, -1), rtol=1e-6)


def test_torch_segmentation_model_in_trainer_matches_torch_cross_entropy():
    """A bridged torch segmentation model's (N, C, H, W) outputs, smoothed along C: the first step's loss is torch's
    F.cross_entropy on Composer's smoothed targets (it used to fail: targets smoothed along W reached torch's
    cross_entropy as class indices)."""
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    import torch_bridge
    from jaxcomposer.core.events import Callback
    from jaxcomposer.trainer.trainer import Trainer

    class Seg(torch_bridge.ComposerModel):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 1)

        def forward(self, batch):
            return self.conv(batch[0])

        def loss(self, outputs, batch):
            return F.cross_entropy(outputs, batch[1])

    class Losses(Callback):
        def __init__(self):
            self.values = []

        def batch_end(self, state, logger):
            self.values.append(float(state.batch_metrics["loss"]))

    torch.manual_seed(0)
    model, losses = Seg(), Losses()
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 4, (8, 8, 8))
    with torch.no_grad():
        expected = F.cross_entropy(model((x[:4], y[:4])), _composer_smoothed_nchw(y[:4], 4, 0.1)).item()
    Trainer(model=model, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=4), max_duration="2ba",
            algorithms=[LabelSmoothing(0.1)], callbacks=[losses], progress_bar=False, seed=0).fit()
    assert len(losses.values) == 2 and np.all(np.isfinite(losses.values))
    assert losses.values[0] == pytest.approx(expected, rel=1e-5)


def test_matches_torch_label_smoothing_cross_entropy(key):
    k1, k2 = jax.random.split(key)
    logits = jax.random.normal(k1, (16, 10)) * 3
    y = jax.random.randint(k2, (16,), 0, 10)
    for s in (0.0, 0.1, 0.35):
        ours = soft_cross_entropy(logits, smooth_labels(logits, y, s))
        ref = torch.nn.functional.cross_entropy(torch.tensor(np.asarray(logits)), torch.tensor(np.asarray(y)).long(),
                                                label_smoothing=s, reduction="none")
        np.testing.assert_allclose(ours, ref.numpy(), rtol=1e-5, atol=1e-6)
        # Composer's formula, written in torch, for the targets themselves.
        t = torch.nn.functional.one_hot(torch.tensor(np.asarray(y)).long(), 10).float() * (1 - s) + s / 10
        np.testing.assert_allclose(smooth_labels(logits, y, s), t.numpy(), rtol=1e-6)


def test_factory_validates():
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="smoothing"):
            LabelSmoothing(smoothing=bad)
        with pytest.raises(ValueError, match="smoothing"):
            smooth_labels(jnp.zeros((2, 3)), jnp.arange(2), bad)


def test_smoothing_one_is_uniform():
    # Composer's documented range is [0, 1]; smoothing=1 ignores the targets entirely
    assert LabelSmoothing(smoothing=1.0).description == "LabelSmoothing(smoothing=1.0)"
    np.testing.assert_allclose(smooth_labels(jnp.zeros((2, 4)), jnp.array([0, 3]), 1.0), np.full((2, 4), 0.25))


def test_integer_one_hot_targets_are_dense():
    # Composer decides by shape: a target of the logits' shape is dense even when its dtype is integer
    y = jnp.array([1, 0, 1])
    logits = jnp.zeros((3, 2))
    got = smooth_labels(logits, jax.nn.one_hot(y, 2, dtype=jnp.int32), 0.2)
    assert got.shape == (3, 2)
    np.testing.assert_array_equal(got, smooth_labels(logits, jax.nn.one_hot(y, 2), 0.2))
    np.testing.assert_array_equal(got, smooth_labels(logits, y, 0.2))
    with pytest.raises(ValueError, match="neither dense"):
        smooth_labels(logits, jnp.zeros((3, 2, 2)), 0.2)


def test_loss_wrapper_leaves_batch_untouched(key):
    m = LabelSmoothing(0.1)
    batch = {"target": jnp.array([1, 2]), "input": jnp.zeros((2, 3))}
    logits = jax.random.normal(key, (2, 3))
    got = m.loss(_loss, make_ctx(0))(logits, batch)
    np.testing.assert_allclose(got, soft_cross_entropy(logits, smooth_labels(logits, batch["target"], 0.1)), rtol=1e-6)
    assert batch["target"].dtype == jnp.int32  # the caller's batch keeps its labels (metrics use them)


# (2) jit == eager, no retrace -------------------------------------------------------------------------------------

def test_jit_equals_eager_and_no_retrace(key):
    wrapped = LabelSmoothing(0.1).loss(_loss, make_ctx(0))
    traces = []

    def f(logits, batch):
        traces.append(1)  # runs once per trace, never per call
        return wrapped(logits, batch)

    jf = jax.jit(f)
    for step in range(5):
        k1, k2 = jax.random.split(jax.random.fold_in(key, step))
        logits = jax.random.normal(k1, (4, 5))
        batch = {"target": jax.random.randint(k2, (4,), 0, 5)}
        np.testing.assert_allclose(jf(logits, batch), wrapped(logits, batch), rtol=1e-6)
    assert len(traces) == 1

