import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from torch import nn

from jaxcomposer.algorithms import BlurPool, apply_blurpool
from jaxcomposer.algorithms.blurpool import BlurConv, blur_2d
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import MLP, ResNetCIFAR
from torch_bridge.surgery import (BlurConv2d, BlurMaxPool2d, apply_blurpool_torch, count_module_instances,
                                  default_2d_filter, replace_module_classes)
from jaxcomposer import algorithms
from tests.algorithms.algo_testing import Example

# one representative configuration: the composition table and the Trainer contract run it
# min_channels=1: the contract tests' ResNetCIFAR(width=4) has only 4- and 8-channel strided convs
EXAMPLE = Example(lambda: algorithms.BlurPool(min_channels=1), surgery=BlurConv)

FILTER = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16


def _ref_blur_nchw(x: np.ndarray, stride: int) -> np.ndarray:
    """Hand-written depthwise 3x3 cross-correlation, zero padding 1, then subsample."""
    n, c, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros_like(x)
    for i in range(3):
        for j in range(3):
            out += FILTER[i, j] * p[:, :, i:i + h, j:j + w]
    return out[:, :, ::stride, ::stride]


def _ref_maxpool_stride1(x: np.ndarray, k: int) -> np.ndarray:
    n, c, h, w = x.shape
    out = np.full((n, c, h - k + 1, w - k + 1), -np.inf, np.float32)
    for i in range(k):
        for j in range(k):
            out = np.maximum(out, x[:, :, i:i + h - k + 1, j:j + w - k + 1])
    return out


def _params(m) -> list[np.ndarray]:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(nnx.state(m))]


@nnx.jit  # one program per model, not one per eager op and shape
def _eval_forward(model, x):
    return model(x, train=False)


# (1) the filter and the blur -------------------------------------------------------------------------------------

def test_filter_values_and_normalization():
    np.testing.assert_allclose(default_2d_filter().numpy()[0, 0], FILTER)
    assert default_2d_filter().sum().item() == pytest.approx(1.0)
    # blur_2d's impulse response, in every channel, is the filter (it is symmetric, so flipping does not show)
    impulse = np.zeros((1, 7, 7, 5), np.float32)
    impulse[0, 3, 3, :] = 1.0
    response = np.asarray(blur_2d(jnp.asarray(impulse)))
    for c in range(5):
        np.testing.assert_array_equal(response[0, 2:5, 2:5, c], FILTER)
    np.testing.assert_allclose(response.sum(axis=(1, 2)), 1.0)


def test_blur_of_constant_is_constant_away_from_borders():
    x = jnp.full((2, 9, 9, 3), 3.5)
    y = np.asarray(blur_2d(x))
    assert y.shape == x.shape
    np.testing.assert_allclose(y[:, 1:-1, 1:-1], 3.5, rtol=1e-6)
    assert y[0, 0, 0, 0] == pytest.approx(3.5 * 9 / 16)  # zero padding at a corner keeps (2+1)*(2+1)/16 of it
    ys = np.asarray(blur_2d(x, stride=2))
    assert ys.shape == (2, 5, 5, 3)
    np.testing.assert_allclose(ys[:, 1:-1, 1:-1], 3.5, rtol=1e-6)
    yt = BlurMaxPool2d(2)(torch.full((1, 2, 10, 10), -1.5)).numpy()
    np.testing.assert_allclose(yt[:, :, 1:-1, 1:-1], -1.5, rtol=1e-6)


def test_jax_blur_matches_hand_reference(key):
    x = np.asarray(jax.random.normal(key, (2, 7, 6, 4)))
    for s in (1, 2):
        ref = _ref_blur_nchw(x.transpose(0, 3, 1, 2), s).transpose(0, 2, 3, 1)
        np.testing.assert_allclose(np.asarray(blur_2d(jnp.asarray(x), s)), ref, atol=1e-6)


# (2) torch layers against hand-written references ---------------------------------------------------------------

def test_torch_blurmaxpool_matches_reference():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    out = BlurMaxPool2d(kernel_size=2, stride=2)(x).numpy()
    ref = _ref_blur_nchw(_ref_maxpool_stride1(x.numpy(), 2), 2)
    assert out.shape == ref.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    assert "filt2d" not in BlurMaxPool2d(2).state_dict()  # non-persistent buffer


@pytest.mark.parametrize("blur_first", [True, False])
def test_torch_blurconv_matches_reference(blur_first):
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=True)
    x = torch.randn(2, 4, 8, 8)
    bc = BlurConv2d.from_conv2d(conv, blur_first=blur_first)
    np.testing.assert_array_equal(bc.conv.weight.detach().numpy(), conv.weight.detach().numpy())
    np.testing.assert_array_equal(bc.conv.bias.detach().numpy(), conv.bias.detach().numpy())
    with torch.no_grad():
        if blur_first:
            ref = F.conv2d(torch.from_numpy(_ref_blur_nchw(x.numpy(), 1)), conv.weight, conv.bias, stride=2, padding=1)
            ref = ref.numpy()
        else:
            ref = _ref_blur_nchw(F.conv2d(x, conv.weight, conv.bias, stride=1, padding=1).numpy(), 2)
        out = bc(x).numpy()
    assert out.shape == ref.shape == (2, 6, 4, 4)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert set(bc.state_dict()) == {"conv.weight", "conv.bias"}


@pytest.mark.parametrize("blur_first", [True, False])
def test_nnx_blurconv_matches_torch(blur_first):
    torch.manual_seed(1)
    tconv = nn.Conv2d(5, 7, 3, stride=2, padding=1, bias=True)
    jconv = nnx.Conv(5, 7, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), use_bias=True, rngs=nnx.Rngs(0))
    jconv.kernel[...] = jnp.asarray(tconv.weight.detach().numpy().transpose(2, 3, 1, 0))  # OIHW -> HWIO
    jconv.bias[...] = jnp.asarray(tconv.bias.detach().numpy())
    x = torch.randn(3, 5, 9, 8)
    with torch.no_grad():
        ref = BlurConv2d.from_conv2d(tconv, blur_first=blur_first)(x).numpy()
    out = BlurConv.from_conv(jconv, blur_first)(jnp.asarray(x.numpy().transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(out).transpose(0, 3, 1, 2), ref, atol=1e-5)
    assert jconv.strides == (2, 2)  # the wrapped conv was copied, not edited


# (3) surgery ----------------------------------------------------------------------------------------------------

class _Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else None)

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + (x if self.down is None else self.down(x)))


class TorchResNet(nn.Module):
    """ImageNet-style: stride-2 stem (3 in-channels), max-pool, stages 16 -> 32 -> 64 with projection shortcuts."""

    def __init__(self, num_classes=10, in_channels=3, nhwc=False):
        super().__init__()
        self.nhwc = nhwc
        self.stem = nn.Conv2d(in_channels, 16, 3, 2, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.layers = nn.Sequential(_Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 64, 2))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        x = self.pool(F.relu(self.bn(self.stem(x))))
        return self.fc(self.layers(x).mean((2, 3)))


def _torch_snapshot(m):
    return {k: v.clone() for k, v in m.state_dict().items()}, [type(x) for x in m.modules()]


def test_torch_surgery_in_place_as_composer_and_on_a_copy():
    torch.manual_seed(0)
    original = TorchResNet().eval()
    before, types = _torch_snapshot(original)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        y0 = original(x)
    # inplace=False: a copy is surgered, the input keeps its classes and values
    model = copy.deepcopy(original)
    new, replaced = apply_blurpool_torch(model, min_channels=16, inplace=False)
    assert new is not model
    # stem (3 in-channels) is kept; the pool, two strided 3x3 convs and two strided 1x1 projections are replaced
    assert count_module_instances(new, BlurMaxPool2d) == 1
    assert count_module_instances(new, BlurConv2d) == 4
    assert len(replaced) == 5
    assert set(replaced) == {model.pool, model.layers[1].conv1, model.layers[1].down[0], model.layers[2].conv1,
                             model.layers[2].down[0]}  # keys are the input model's modules
    assert isinstance(new.layers[2].down[0], BlurConv2d) and isinstance(new.stem, nn.Conv2d)
    after, types_after = _torch_snapshot(model)
    assert types == types_after and isinstance(model.pool, nn.MaxPool2d)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        y1, y2 = model(x), new.eval()(x)
    torch.testing.assert_close(y1, y0)
    assert y2.shape == y0.shape and not torch.allclose(y2, y0)
    np.testing.assert_array_equal(new.layers[1].conv1.conv.weight.detach().numpy(),
                                  model.layers[1].conv1.weight.detach().numpy())
    assert "layers.1.conv1.conv.weight" in new.state_dict()
    # the default, as Composer: the module itself is edited and returned, computing what the copy computes
    pool, conv = model.pool, model.layers[1].conv1
    same, replaced = apply_blurpool_torch(model, min_channels=16)
    assert same is model and isinstance(model.pool, BlurMaxPool2d) and replaced[pool] is model.pool
    assert torch.equal(model.layers[1].conv1.conv.weight, conv.weight)  # weights copied, as Composer's from_conv2d
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), y2, rtol=0, atol=0)

    new32, _ = apply_blurpool_torch(copy.deepcopy(original), min_channels=32, replace_maxpools=False)
    assert count_module_instances(new32, BlurConv2d) == 2 and count_module_instances(new32, BlurMaxPool2d) == 0


def test_replace_module_classes_semantics():
    shared = nn.Linear(4, 4)
    model = nn.Sequential(shared, nn.ReLU(), nn.Sequential(shared, nn.Linear(4, 2)))
    seen = []

    def policy(m, idx):
        seen.append(idx)
        return nn.Identity() if m.out_features == 4 else None

    new, replaced = replace_module_classes(model, {nn.Linear: policy}, inplace=False)
    assert seen == [0, 1]  # the shared Linear is visited once, then the second one
    assert list(replaced) == [shared]
    assert isinstance(new[0], nn.Identity) and new[2][0] is new[0]  # replaced in both parents
    assert isinstance(new[2][1], nn.Linear)
    assert model[0] is shared and model[2][0] is shared  # input untouched
    same, replaced = replace_module_classes(model, {nn.Linear: policy})  # in place, as Composer
    assert same is model and isinstance(model[0], nn.Identity) and model[2][0] is model[0]
    assert list(replaced) == [shared]


def test_nnx_surgery_counts_and_original_untouched(key):
    model = ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=3, rngs=nnx.Rngs(0))
    before = _params(model)
    x = jax.random.normal(key, (2, 8, 8, 3))
    y0 = _eval_forward(model, x)
    new = apply_blurpool(model, min_channels=16)
    # depth 8: one block per stage. Stem: 3 in-channels, stride 1 -> kept. Block 0 (16->16, stride 1) -> none.
    # Block 1 (16->32, stride 2): conv1 + proj_conv (16 in-channels). Block 2 (32->64): conv1 + proj_conv. = 4
    blur = [m for _, m in nnx.iter_graph(new) if isinstance(m, BlurConv)]
    assert len(blur) == 4
    assert [type(b.conv1) for b in new.blocks] == [nnx.Conv, BlurConv, BlurConv]
    assert isinstance(new.blocks[1].proj_conv, BlurConv) and isinstance(new.blocks[2].proj_conv, BlurConv)
    assert isinstance(new.blocks[1].conv2, nnx.Conv) and isinstance(new.stem_conv, nnx.Conv)
    assert not any(isinstance(m, BlurConv) for _, m in nnx.iter_graph(model))  # original untouched
    assert all(np.array_equal(a, b) for a, b in zip(before, _params(model)))
    np.testing.assert_array_equal(np.asarray(_eval_forward(model, x)), np.asarray(y0))
    np.testing.assert_array_equal(np.asarray(new.blocks[1].conv1.conv.kernel[...]),
                                  np.asarray(model.blocks[1].conv1.kernel[...]))
    y1 = _eval_forward(new, x)
    assert y1.shape == y0.shape and not np.allclose(np.asarray(y1), np.asarray(y0))
    # same number of trainable values: the filter is a constant
    assert len(jax.tree_util.tree_leaves(nnx.state(new, nnx.Param))) == len(
        jax.tree_util.tree_leaves(nnx.state(model, nnx.Param)))
    assert len([m for _, m in nnx.iter_graph(apply_blurpool(model, min_channels=32)) if isinstance(m, BlurConv)]) == 2
    # applying twice does not blur twice (and does not warn: the model has blur layers, as Composer counts)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twice = apply_blurpool(new, min_channels=16)
    assert len([m for _, m in nnx.iter_graph(twice) if isinstance(m, BlurConv)]) == 4


def test_nnx_blur_last_keeps_shapes(key):
    model = ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=3, rngs=nnx.Rngs(0))
    new = apply_blurpool(model, blur_first=False)
    x = jax.random.normal(key, (2, 9, 9, 3))
    shape = lambda m: nnx.eval_shape(lambda m, x: m(x, train=False), m, x).shape  # shapes only: nothing compiled
    assert shape(new) == shape(model) == (2, 10)
    assert new.blocks[1].conv1.conv.strides == (1, 1) and model.blocks[1].conv1.strides == (2, 2)


def test_nothing_replaced_warns():
    model = ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=3, rngs=nnx.Rngs(0))
    with pytest.warns(NoEffectWarning, match="did not change any layers"):
        new = apply_blurpool(model, min_channels=1000)
    assert not any(isinstance(m, BlurConv) for _, m in nnx.iter_graph(new)) and new is not model
    tmodel = TorchResNet()
    with pytest.warns(NoEffectWarning):
        tnew = apply_blurpool(tmodel, min_channels=1000, replace_maxpools=False)
    assert count_module_instances(tnew, (BlurConv2d, BlurMaxPool2d)) == 0
    with pytest.warns(NoEffectWarning):
        apply_blurpool(MLP(64, hidden=(32,), num_classes=10, rngs=nnx.Rngs(0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_blurpool(tmodel)  # replacements happen: no warning
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_blurpool(object())


def test_method_model_slot_edits_the_model_in_place_as_composer():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = ResNetCIFAR(depth=8, width=16, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))
    task = ComposerClassifier(model, num_classes=10)
    method = BlurPool()
    assert method.name == "BlurPool" and method.model is not None and method.batch is None
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))  # host, once, as the Trainer
    assert new_task.source is model and isinstance(model.blocks[1].conv1, BlurConv)  # the user's module, blurred
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_task.params)[0]]
    assert any("['conv1']['conv']['kernel']" in p for p in paths)  # replaced convs gain a ``conv`` segment
    with pytest.raises(ValueError, match="min_channels"):
        BlurPool(min_channels=-1)


# (4) inside the Trainer -----------------------------------------------------------------------------------------

def _fit(task, algorithms):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0),
                      max_duration="2ba", optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=algorithms,
                      seed=0, progress_bar=False, devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    return trainer, [v for _, v in logger.data["loss/train/total"]]


def _bridge_ready() -> bool:
    try:
        from torch_bridge import from_torch  # noqa: F401
        return True
    except Exception:  # the bridge is being written; any import failure means "not ready"
        return False


@pytest.mark.skipif(not _bridge_ready(), reason="torch_bridge.from_torch is not available yet")
def test_trains_bridged_torch_cnn_with_maxpool():
    from jaxcomposer.models.tasks import ComposerClassifier
    from torch_bridge import from_torch

    torch.manual_seed(0)
    module = nn.Sequential(  # NHWC digits (B, 8, 8, 1) in
        _ToNCHW(), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), _GlobalMean(), nn.Linear(32, 10))
    trainer, losses = _fit(ComposerClassifier(module, num_classes=10), [BlurPool()])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    # as Composer: the user's module was surgered in place, trained, and holds the trained weights
    assert trainer.state.model.module is module and isinstance(module[3], BlurMaxPool2d) and isinstance(module[4], BlurConv2d)
    names = set(trainer.task.pure.params)
    assert "4.conv.weight" in names and "4.weight" not in names  # the strided conv is a BlurConv2d
    np.testing.assert_array_equal(module[4].conv.weight.detach().numpy(), trainer.state.train_state.params["4.conv.weight"])
    # the torch module computes what the trainer's jitted forward computes
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


class _ToNCHW(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


class _GlobalMean(nn.Module):
    def forward(self, x):
        return x.mean((2, 3))
