import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.algorithms import ProgressiveResizing, resize_batch
from jaxcomposer.core.method import Method, ModelView
from tests.algorithms.algo_testing import make_batch, make_ctx
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# 8x8 images at scale 0.5 (4x4) while t < 0.5: one size over 2 steps, full size at step 3 of 4. image_size pins
# sizes while the stage is not given the batch's shapes. Image models only (an MLP's fixed fan-in rejects them)
EXAMPLE = Example(lambda: algorithms.ProgressiveResizing(initial_scale=0.5))


def _host(step, total):
    """The ctx the stage slot sees on the host at ``step`` of ``total``: the clock as a Python int."""
    return make_ctx(0, total_steps=total)._replace(step=step)


def _nchw(x):
    return jnp.transpose(x, (0, 3, 1, 2))


# (1) functional numerics ----------------------------------------------------------------------------------------

def test_nearest_hand_checked():
    x = jnp.arange(16.0).reshape(1, 4, 4, 1)
    out, _ = resize_batch(x, jnp.zeros(1), 0.5)
    np.testing.assert_array_equal(out[0, :, :, 0], [[0, 2], [8, 10]])  # even rows and columns
    x = jnp.tile(jnp.arange(6.0), (6, 1)).reshape(1, 6, 6, 1)
    out, _ = resize_batch(x, jnp.zeros(1), 4 / 6)  # floor(6 * 4/6) = 4 columns from floor(i * 1.5) = 0, 1, 3, 4
    assert out.shape == (1, 4, 4, 1)
    np.testing.assert_array_equal(out[0, 0, :, 0], [0, 1, 3, 4])


def test_size_is_floor_of_scaled_side():
    # Composer pins the width to 30 for W=44, but F.interpolate's floor(44 * (30 / 44)) is 29: kept as a quirk.
    out, _ = resize_batch(jnp.zeros((1, 44, 44, 1)), jnp.zeros(1), 30 / 44)
    assert out.shape == (1, 29, 29, 1)


# one program per case (the factor fixes the output shape), instead of one per eager op and shape
_jit_resize = jax.jit(lambda x, sf, interpolation: resize_batch(x, None, sf, data_format="NCHW",
                                                               interpolation=interpolation)[0], static_argnums=(1, 2))


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_matches_torch_interpolate(interpolation):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    # every factor of an 8x8 image, and factors whose weights or sizes round awkwardly at odd sizes
    cases = [((8, 8), p) for p in range(1, 8)] + [((44, 44), p) for p in (17, 24, 29, 30)] + \
        [((22, 30), p) for p in (12, 27, 29)] + [((7, 13), p) for p in (5, 9)]
    for (h, w), pinned in cases:
        sf = pinned / w
        x = rng.normal(size=(2, 3, h, w)).astype(np.float32)
        kw = {} if interpolation == "nearest" else {"align_corners": False}
        ref = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=sf, mode=interpolation,
                                              recompute_scale_factor=False, **kw).numpy()
        ours = np.asarray(_jit_resize(x, sf, interpolation))
        assert ours.shape == ref.shape, (h, w, pinned)
        if interpolation == "nearest":
            np.testing.assert_array_equal(ours, ref, err_msg=str((h, w, pinned)))
        else:
            np.testing.assert_allclose(ours, ref, atol=2e-6, rtol=0, err_msg=str((h, w, pinned)))


def test_nhwc_equals_nchw_and_factor_one_is_identity(key):
    x = jax.random.normal(key, (2, 12, 10, 3))
    y = jnp.arange(2)
    for interpolation in ("nearest", "bilinear"):
        a, _ = resize_batch(x, y, 0.6, interpolation=interpolation)
        b, _ = resize_batch(_nchw(x), y, 0.6, data_format="NCHW", interpolation=interpolation)
        np.testing.assert_array_equal(_nchw(a), b)
        assert a.shape == (2, 7, 6, 3)
    for sf in (1.0, 1.25):
        out, tgt = resize_batch(x, y, sf)
        assert out is x and tgt is y  # unchanged objects, as Composer's short-circuit


def test_targets_follow_inputs(key):
    x = jax.random.normal(key, (2, 8, 12, 3))
    labels = jax.random.randint(key, (2, 8, 12), 0, 5)  # (N, H, W) label map
    dense = jax.random.normal(jax.random.fold_in(key, 1), (2, 8, 12, 4))
    for interpolation in ("nearest", "bilinear"):
        out, lab = resize_batch(x, labels, 0.5, resize_targets=True, interpolation=interpolation)
        assert lab.dtype == labels.dtype and lab.shape == (2, 4, 6)
        np.testing.assert_array_equal(lab, labels[:, ::2, ::2])  # always nearest: label maps are never blended
        _, d = resize_batch(x, dense, 0.5, resize_targets=True)
        np.testing.assert_array_equal(d, dense[:, ::2, ::2])
    # resize_targets=False leaves targets alone
    _, same = resize_batch(x, labels, 0.5)
    assert same is labels


def test_crop_window(key):
    x = jnp.arange(2 * 8 * 10 * 1, dtype=jnp.float32).reshape(2, 8, 10, 1)
    out, _ = resize_batch(x, jnp.zeros(2), 0.5, mode="crop", key=key)
    assert out.shape == (2, 4, 5, 1)
    top, left = int(out[0, 0, 0, 0]) // 10, int(out[0, 0, 0, 0]) % 10
    np.testing.assert_array_equal(out, x[:, top:top + 4, left:left + 5])  # one window for the whole batch
    np.testing.assert_array_equal(out, resize_batch(x, jnp.zeros(2), 0.5, mode="crop", key=key)[0])
    # Corners are drawn from [0, H - Hc) x [0, W - Wc), torch.randint's range: the last offset never appears.
    corners = jax.vmap(lambda k: resize_batch(x, jnp.zeros(2), 0.5, mode="crop", key=k)[0][0, 0, 0, 0])(
        jax.random.split(key, 400))
    tops, lefts = set((np.asarray(corners) // 10).astype(int)), set((np.asarray(corners) % 10).astype(int))
    assert tops == set(range(4)) and lefts == set(range(5))


def test_crop_targets_same_region(key):
    x = jnp.arange(8 * 8, dtype=jnp.float32).reshape(1, 8, 8, 1)
    y = jnp.repeat(jnp.repeat(x[..., 0], 2, axis=1), 2, axis=2).astype(jnp.int32)  # (1, 16, 16) at 2x resolution
    for k in jax.random.split(key, 8):
        out, tgt = resize_batch(x, y, 0.5, mode="crop", resize_targets=True, key=k)
        assert tgt.shape == (1, 8, 8)
        np.testing.assert_array_equal(tgt[0, ::2, ::2], out[0, :, :, 0].astype(jnp.int32))


def test_crop_needs_key_and_images_only():
    with pytest.raises(ValueError, match="key"):
        resize_batch(jnp.ones((1, 8, 8, 1)), jnp.zeros(1), 0.5, mode="crop")
    with pytest.raises(ValueError, match="4-D"):
        resize_batch(jnp.ones((4, 64)), jnp.zeros(4), 0.5)
    with pytest.raises(ValueError, match="resize_targets"):
        resize_batch(jnp.ones((4, 8, 8, 1)), jnp.zeros(4), 0.5, resize_targets=True)


# the schedule (stage slot) ----------------------------------------------------------------------------------------

def test_schedule_matches_composer_formula():
    m = ProgressiveResizing(image_size=32)  # initial 0.5, delay 0.5, finetune 0.2, increment 4
    stages = [m.stage(None, _host(s, 100)) for s in range(100)]
    assert set(stages[:50]) == {0.5}  # 16 px until the ramp starts
    # t = 0.65: s = 0.5 + 0.5 * 0.15 / 0.3 = 0.75 -> 24 px; t = 0.7: s = 0.8333 -> round(6.67) * 4 = 28 px
    assert stages[65] == 24 / 32 and stages[70] == 28 / 32
    assert set(stages[80:]) == {1.0}  # finetune at full size
    assert sorted(set(stages)) == [0.5, 0.625, 0.75, 0.875, 1.0]  # one stage (one compile) per size bucket
    assert stages == sorted(stages)


def test_schedule_quirks():
    # W=10 is not a multiple of 4: at full scale round(10 / 4) * 4 = 8 (half to even), so it still shrinks.
    assert ProgressiveResizing(image_size=10).stage(None, _host(99, 100)) == 0.8
    # a zero-length ramp jumps to full size at delay_fraction
    m = ProgressiveResizing(delay_fraction=0.5, finetune_fraction=0.5, image_size=8)
    assert [m.stage(None, _host(s, 4)) for s in range(4)] == [0.5, 0.5, 1.0, 1.0]
    # the width comes from the batch's shapes when the stage gets them (NHWC axis 2, NCHW axis 3)
    assert ProgressiveResizing().stage({"input": (8, 32, 16, 3), "target": (8,)}, _host(0, 10)) == 0.5
    assert ProgressiveResizing(data_format="NCHW").stage({"input": jnp.zeros((2, 3, 16, 12))}, _host(0, 10)) == 8 / 12
    with pytest.raises(ValueError, match="image_size"):
        ProgressiveResizing().stage(None, _host(0, 10))
    with pytest.raises(ValueError, match="4-D"):
        ProgressiveResizing().stage({"input": (32, 64)}, _host(0, 10))
    with pytest.raises(ValueError, match="0 pixels"):
        ProgressiveResizing(initial_scale=0.1, image_size=8).stage(None, _host(0, 10))


def test_factory_validates():
    for kw, match in [({"mode": "zoom"}, "mode"), ({"initial_scale": 1.5}, "initial_scale"),
                      ({"finetune_fraction": -0.1}, "finetune_fraction"), ({"delay_fraction": 1.2}, "delay_fraction"),
                      ({"delay_fraction": 0.6, "finetune_fraction": 0.5}, "<= 1"),
                      ({"size_increment": 0}, "size_increment"), ({"size_increment": 2.5}, "size_increment"),
                      ({"interpolation": "cubic"}, "interpolation"), ({"data_format": "HWC"}, "data_format"),
                      ({"image_size": (8, 8, 3)}, "image_size"), ({"image_size": 0}, "image_size")]:
        with pytest.raises(ValueError, match=match):
            ProgressiveResizing(**kw)


def test_batch_slot_needs_a_stage_and_images(key):
    m = ProgressiveResizing(image_size=8)
    batch = make_batch(key)
    with pytest.raises(ValueError, match="ctx.stage is None"):
        m.batch(batch, make_ctx(0))
    with pytest.raises(ValueError, match="4-D"):  # the MLP's flat digits: Composer only resizes image batches
        m.batch({"input": jnp.ones((4, 64)), "target": jnp.zeros(4, jnp.int32)}, make_ctx(0)._replace(stage=0.5))
    out = m.batch(batch, make_ctx(0)._replace(stage=0.5))
    assert out["input"].shape == (4, 4, 4, 3) and out["target"] is batch["target"]


# (2) jit == eager, one trace per stage ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["resize", "crop"])
def test_jit_equals_eager_and_retraces_only_per_stage(key, mode):
    m = ProgressiveResizing(mode=mode, initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.5,
                            size_increment=2, image_size=8)
    traces = []

    def f(batch, step, k, stage):
        traces.append(stage)
        return m.batch(batch, make_ctx(step, k)._replace(stage=stage))

    jf = jax.jit(f, static_argnums=3)
    total, stages = 8, []
    for i in range(total):
        k = jax.random.fold_in(key, i)
        batch, stage = make_batch(k), m.stage(None, _host(i, total))
        stages.append(stage)
        got = jf(batch, i, k, stage)["input"]
        np.testing.assert_array_equal(got, f(batch, i, k, stage)["input"])
        assert got.shape[1] == int(8 * stage)
    assert sorted(set(stages)) == [0.5, 0.75, 1.0]
    assert len(traces) == 3 + total  # one trace per distinct stage; the eager calls run the Python body each time


def test_trainer_compiles_once_per_stage():
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.models import ResNetCIFAR
    from jaxcomposer.models.tasks import ComposerClassifier
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    seen = []  # the shapes the model gets, recorded at trace time by a method listed after ProgressiveResizing
    spy = Method(name="Spy", batch=lambda b, ctx: (seen.append(b["input"].shape), b)[1])
    method = ProgressiveResizing(initial_scale=0.5, delay_fraction=0.0, finetune_fraction=0.34, size_increment=2,
                                 image_size=8)
    task = ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)),
                              num_classes=10)
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=192), 32, seed=0),
                      max_duration="6ba", optimizers=DecoupledSGDW(lr=0.05), algorithms=[method, spy], seed=1,
                      progress_bar=False, devices=jax.devices()[:1])
    trainer.fit()
    stages = {trainer.composed.stage({"input": (32, 8, 8, 1)}, _host(s, 6)) for s in range(6)}
    assert len(stages) == 3 and list(trainer.compiled_programs().values()) == [len(stages)]
    assert seen == [(32, 4, 4, 1), (32, 6, 6, 1), (32, 8, 8, 1)]
    assert np.isfinite(float(trainer.state.batch_metrics["loss"]))


def test_layout_follows_the_model(key):
    """A bridged torch model's batches are NCHW: the stage pins the width (axis 3) and the batch slot shrinks H and
    W; a JAX/NNX model's are NHWC. It used to read NCHW as NHWC: (16, 3, 32, 32) became (16, 1, 16, 32)."""
    method = ProgressiveResizing(initial_scale=0.5)
    torch_ctx = _host(0, 10)._replace(model=ModelView(param_layout="torch"))
    nchw = jax.random.uniform(key, (16, 3, 32, 24))
    stage = method.stage({"input": nchw.shape}, torch_ctx)
    assert stage == 0.5  # width 24 pinned to 12: a factor of 0.5 (not 16 / 32 read from H)
    out = method.batch({"input": nchw, "target": jnp.arange(16)}, torch_ctx._replace(stage=stage))
    assert out["input"].shape == (16, 3, 16, 12)
    np.testing.assert_array_equal(out["input"], nchw[:, :, ::2, ::2])  # nearest at 0.5 keeps every other pixel
    nhwc = jnp.transpose(nchw, (0, 2, 3, 1))
    assert method.stage({"input": nhwc.shape}, _host(0, 10)) == 0.5
    out = method.batch({"input": nhwc}, make_ctx(0, stage=0.5))
    np.testing.assert_array_equal(out["input"], nhwc[:, ::2, ::2, :])
    forced = ProgressiveResizing(initial_scale=0.5, data_format="NHWC")  # an explicit layout wins
    assert forced.batch({"input": nchw}, torch_ctx._replace(stage=0.5))["input"].shape == (16, 1, 16, 24)


def test_resize_batch_on_torch_tensors_is_nchw():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(4, 3, 32, 32, generator=g), torch.randint(0, 5, (4, 32, 32), generator=g)
    out, target = resize_batch(x, y, 0.5, resize_targets=True)  # Composer's positional call
    assert isinstance(out, torch.Tensor) and out.shape == (4, 3, 16, 16)
    torch.testing.assert_close(out, torch.nn.functional.interpolate(x, scale_factor=0.5, mode="nearest"))
    assert target.dtype == torch.int64 and torch.equal(target, y[:, ::2, ::2])


def test_torch_cnn_in_trainer_sees_nchw_batches_resized():
    """A small torch CNN on (N, 3, 32, 32) images: at scale 0.5 its forward gets (N, 3, 16, 16) (the bridge
    exports a graph for that size), and the loss is torch's on the resized images."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from jaxcomposer.core.events import Callback
    from jaxcomposer.trainer.trainer import Trainer

    class Losses(Callback):
        def __init__(self):
            self.values = []

        def batch_end(self, state, logger):
            self.values.append(float(state.batch_metrics["loss"]))

    seen, losses = [], Losses()
    spy = Method(name="Spy", batch=lambda b, ctx: (seen.append(tuple(b["input"].shape)), b)[1])
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 2))
    start = copy.deepcopy(net)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 2, (16,))
    trainer = Trainer(model=net, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=8), max_duration="2ba",
                      algorithms=[ProgressiveResizing(initial_scale=0.5), spy], callbacks=[losses],
                      progress_bar=False, seed=0, devices=jax.devices()[:1])
    assert trainer.model_view.param_layout == "torch"
    trainer.fit()
    assert seen == [(8, 3, 16, 16)]  # both steps at scale 0.5 (t < delay_fraction): one size, one trace
    with torch.no_grad():
        small = torch.nn.functional.interpolate(x[:8], scale_factor=0.5, mode="nearest")
        expected = torch.nn.functional.cross_entropy(start(small), y[:8]).item()
    assert losses.values[0] == pytest.approx(expected, rel=1e-5)


def test_torch_composer_model_trains_on_resized_batches():
    """A Composer model (forward(batch) + loss) gets the resized batch too: its forward is exported again for the
    smaller size, and the loss is its own on the resized images."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from jaxcomposer.core.events import Callback
    from jaxcomposer.models import ComposerModel
    from jaxcomposer.trainer.trainer import Trainer

    class Net(ComposerModel):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 2))

        def forward(self, batch):
            return self.body(batch[0])

        def loss(self, outputs, batch):
            return F.cross_entropy(outputs, batch[1])

    losses = []

    class Losses(Callback):
        def batch_end(self, state, logger):
            losses.append(float(state.loss))

    torch.manual_seed(0)
    model = Net()
    start = copy.deepcopy(model)
    x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 2, (16,))
    Trainer(model=model, train_dataloader=DataLoader(TensorDataset(x, y), batch_size=8), max_duration="1ba",
            algorithms=[ProgressiveResizing(initial_scale=0.5)], callbacks=[Losses()], progress_bar=False,
            seed=0, devices=jax.devices()[:1]).fit()
    with torch.no_grad():
        small = torch.nn.functional.interpolate(x[:8], scale_factor=0.5, mode="nearest")
        expected = F.cross_entropy(start((small, y[:8])), y[:8]).item()
    assert losses == [pytest.approx(expected, rel=1e-5)]
