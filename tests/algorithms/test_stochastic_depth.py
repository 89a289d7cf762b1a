import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from jaxcomposer import algorithms
from jaxcomposer.algorithms import StochasticDepth, apply_stochastic_depth
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.stochastic_depth import (DropWarmupScale, StochasticBasicBlock, StochasticBottleneck,
                                                     layer_drop_rates)
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import ResNetCIFAR, ResNetImageNet
from jaxcomposer.models.resnet import BasicBlock
from jaxcomposer.models.resnet_imagenet import Bottleneck
from tests.algorithms.algo_testing import Example
from torch_bridge.methods.stochastic_depth import apply_stochastic_depth_torch

# block mode with a warmup: the contract's 2-step run uses no drops at step 0 and the full linear rates at step 1,
# so it covers the model surgery, the grad-slot warmup (model state) and the key-driven drops on resume
EXAMPLE = Example(lambda: algorithms.StochasticDepth("ResNetBasicBlock", drop_rate=0.5, drop_warmup=0.5))


@nnx.jit(static_argnames=("train",))
def _forward(model, x, key, train):
    return model(x, train=train, key=key)


def _paths(m, kind=nnx.Param):
    return [p for p, _ in jax.tree_util.tree_flatten_with_path(nnx.state(m, kind))[0]]


def _leaves(m):
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(nnx.state(m))]


@functools.cache
def _cifar() -> ResNetCIFAR:
    return ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=3, rngs=nnx.Rngs(0))


# (1) rates and the block's forward against hand references -------------------------------------------------------

def test_layer_drop_rates_as_composer():
    np.testing.assert_allclose(layer_drop_rates(4, 0.2, "linear"), [0.05, 0.1, 0.15, 0.2])
    assert layer_drop_rates(3, 0.2, "uniform") == [0.2, 0.2, 0.2]


@pytest.mark.parametrize("method", ["block", "sample"])
def test_nnx_block_matches_hand_reference(method, key):
    plain = BasicBlock(4, 8, 2, 0.9, False, rngs=nnx.Rngs(1))
    x = jax.random.normal(key, (16, 6, 6, 4))
    res_eval, sc_eval = plain.residual(x, train=False), plain.shortcut(x, train=False)
    # eval: the branch scaled by its keep probability
    stoch = StochasticBasicBlock(nnx.clone(plain), 0.3, method)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda b, v: b(v, train=False))(stoch, x)),
                               np.asarray(jax.nn.relu(0.7 * res_eval + sc_eval)), rtol=1e-5, atol=1e-6)
    # training, p = 1: only the shortcut (with a projection, relu(shortcut))
    always = StochasticBasicBlock(nnx.clone(plain), 1.0, method)
    sc_train = nnx.clone(plain).shortcut(x, train=True)
    np.testing.assert_allclose(np.asarray(_forward(always, x, key, True)), np.asarray(jax.nn.relu(sc_train)),
                               rtol=1e-6, atol=1e-6)
    # training, p = 0.5: each output is the kept or the dropped forward, whole block (block) or per example
    half = StochasticBasicBlock(nnx.clone(plain), 0.5, method)
    kept = np.asarray(jax.nn.relu(nnx.clone(plain).residual(x, train=True) + sc_train))
    dropped = np.asarray(jax.nn.relu(sc_train))
    n_kept = n_total = 0
    for i in range(8):  # one compiled forward, eight keys
        out = np.asarray(_forward(nnx.clone(half), x, jax.random.fold_in(key, i), True))
        is_kept = np.all(np.isclose(out, kept, atol=1e-5), axis=(1, 2, 3))
        is_dropped = np.all(np.isclose(out, dropped, atol=1e-5), axis=(1, 2, 3))
        assert np.all(is_kept | is_dropped)
        if method == "block":
            assert is_kept.all() or is_dropped.all()  # one draw for the whole batch
        n_kept, n_total = n_kept + is_kept.sum(), n_total + len(out)
    assert 0.2 < n_kept / n_total < 0.8
    # same key, same drops
    np.testing.assert_array_equal(np.asarray(_forward(nnx.clone(half), x, key, True)),
                                  np.asarray(_forward(nnx.clone(half), x, key, True)))


def test_dropped_block_without_projection_is_identity_and_keeps_bn_stats(key):
    plain = BasicBlock(4, 4, 1, 0.9, False, rngs=nnx.Rngs(2))
    stoch = StochasticBasicBlock(plain, 1.0, "block")
    before = _leaves(stoch)
    x = jax.random.normal(key, (2, 5, 5, 4))
    np.testing.assert_array_equal(np.asarray(_forward(stoch, x, key, True)), np.asarray(x))
    # the dropped branch left its BatchNorm statistics as they were (Composer does not run it)
    assert all(np.array_equal(a, b) for a, b in zip(before, _leaves(stoch)))
    kept = StochasticBasicBlock(BasicBlock(4, 4, 1, 0.9, False, rngs=nnx.Rngs(2)), 1e-6, "block")  # kept here
    _forward(kept, x, key, True)
    assert not all(np.array_equal(a, b) for a, b in zip(before, _leaves(kept)))  # a kept branch updates them
    with pytest.raises(ValueError, match="needs a PRNG key"):
        StochasticBasicBlock(BasicBlock(4, 4, 1, 0.9, False, rngs=nnx.Rngs(2)), 0.5, "block")(x, train=True)


# (2) parity with the torch surgery (torchvision's Bottleneck layout) --------------------------------------------

class Bottleneck_(nn.Module):
    """torchvision's ``Bottleneck`` layout (torchvision is not installed here); renamed below to its class name."""

    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out = out + (x if self.downsample is None else self.downsample(x))
        return self.relu(out)


class BasicBlock_(nn.Module):
    """torchvision's ``BasicBlock`` layout."""

    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


Bottleneck_.__name__ = "Bottleneck"
BasicBlock_.__name__ = "BasicBlock"


def _torch_bottleneck(inplanes=8, planes=2, stride=2):
    down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))
    block = Bottleneck_(inplanes, planes, stride, down)
    with torch.no_grad():  # non-trivial BN affine params and running stats
        for bn in (block.bn1, block.bn2, block.bn3, down[1]):
            bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.2, 0.2), bn.running_var.uniform_(0.5, 1.5)
    return block


def _copy_to_nnx(tblock) -> Bottleneck:
    """Our Bottleneck with the torch block's weights (OIHW -> HWIO) and BN state."""
    jblock = Bottleneck(8, 2, 2, 0.9, False, rngs=nnx.Rngs(0))
    pairs = [(jblock.conv1, jblock.bn1, tblock.conv1, tblock.bn1), (jblock.conv2, jblock.bn2, tblock.conv2, tblock.bn2),
             (jblock.conv3, jblock.bn3, tblock.conv3, tblock.bn3),
             (jblock.proj_conv, jblock.proj_bn, tblock.downsample[0], tblock.downsample[1])]
    for jc, jb, tc, tb in pairs:
        jc.kernel[...] = jnp.asarray(tc.weight.detach().numpy().transpose(2, 3, 1, 0))
        jb.scale[...], jb.bias[...] = jnp.asarray(tb.weight.detach().numpy()), jnp.asarray(tb.bias.detach().numpy())
        jb.mean[...], jb.var[...] = jnp.asarray(tb.running_mean.numpy()), jnp.asarray(tb.running_var.numpy())
    return jblock


@pytest.mark.parametrize("method", ["block", "sample"])
def test_nnx_bottleneck_matches_torch_surgery(method):
    torch.manual_seed(0)
    tblock = _torch_bottleneck()
    jblock = _copy_to_nnx(tblock)
    x = torch.randn(4, 8, 6, 6)
    xj = jnp.asarray(x.numpy().transpose(0, 2, 3, 1))
    holder = nn.Sequential(tblock)
    same, count = apply_stochastic_depth_torch(holder, "ResNetBottleneck", method, 0.6, "linear")
    assert same is holder and count == 1 and float(tblock.drop_rate) == pytest.approx(0.6)
    jstoch = StochasticBottleneck(jblock, 0.6, method)
    with torch.no_grad():
        ref_eval = tblock.eval()(x).numpy()
    out = _forward(jstoch, xj, None, False)
    np.testing.assert_allclose(np.asarray(out).transpose(0, 3, 1, 2), ref_eval, rtol=1e-5, atol=1e-5)
    # training with p = 1 (always dropped) and p = 0 (never): the RNG streams differ, the functions do not
    for p in (1.0, 0.0):
        tblock.drop_rate = torch.tensor(p)
        with torch.no_grad():
            ref = tblock.train()(x).numpy()
        out = _forward(StochasticBottleneck(nnx.clone(jblock), p, method), xj, jax.random.key(0), True)
        np.testing.assert_allclose(np.asarray(out).transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-5)


# (3) surgery ----------------------------------------------------------------------------------------------------

def test_nnx_surgery_counts_paths_and_original_untouched(key):
    model = _cifar()
    before = _leaves(model)
    new = apply_stochastic_depth(model, "ResNetBasicBlock", "block", 0.3, "linear")
    assert [type(b) for b in new.blocks] == [StochasticBasicBlock] * 3
    np.testing.assert_allclose([b.drop_rate for b in new.blocks], [0.1, 0.2, 0.3])
    assert [type(b) for b in model.blocks] == [BasicBlock] * 3  # the original is untouched
    assert all(np.array_equal(a, b) for a, b in zip(before, _leaves(model)))
    assert _paths(new) == _paths(model) and _paths(new, ...) == _paths(model, ...)  # same params and state paths
    assert new.blocks[1].conv1 is not model.blocks[1].conv1  # a clone
    uniform = apply_stochastic_depth(model, "ResNetBasicBlock", "sample", 0.3, "uniform")
    assert [b.drop_rate for b in uniform.blocks] == [0.3] * 3 and uniform.blocks[0].stochastic_method == "sample"
    # eval: each branch scaled by 1 - p; p = 0 gives the plain model exactly
    x = jax.random.normal(key, (2, 8, 8, 3))
    zero = apply_stochastic_depth(model, "ResNetBasicBlock", drop_rate=0.0)
    np.testing.assert_array_equal(np.asarray(_forward(zero, x, None, False)),
                                  np.asarray(_forward(model, x, None, False)))
    assert not np.allclose(np.asarray(_forward(new, x, None, False)), np.asarray(_forward(model, x, None, False)))
    # applying again re-configures the blocks (Composer re-patches the forward), never nests them
    again = apply_stochastic_depth(new, "ResNetBasicBlock", drop_rate=0.6, drop_distribution="uniform")
    assert [type(b) for b in again.blocks] == [StochasticBasicBlock] * 3 and again.blocks[2].drop_rate == 0.6
    # the ImageNet ResNet's bottlenecks
    imagenet = ResNetImageNet(layers=(1, 2), width=4, num_classes=5, rngs=nnx.Rngs(0))
    surgered = apply_stochastic_depth(imagenet, "ResNetBottleneck", drop_rate=0.3)
    assert [type(b) for b in surgered.blocks] == [StochasticBottleneck] * 3
    np.testing.assert_allclose([b.drop_rate for b in surgered.blocks], [0.1, 0.2, 0.3])
    assert _paths(surgered, ...) == _paths(imagenet, ...)


def test_jit_equals_eager_and_functional_equals_method(key):
    from jaxcomposer.models.tasks import ComposerClassifier
    model = nnx.clone(_cifar())
    task = ComposerClassifier(model, num_classes=10)
    method = StochasticDepth("ResNetBasicBlock", "sample", drop_rate=0.5)
    assert method.name == "StochasticDepth" and method.grad is None  # no warmup: model slot only
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is model and isinstance(model.blocks[0], StochasticBasicBlock)  # in place
    functional = apply_stochastic_depth(_cifar(), "ResNetBasicBlock", "sample", 0.5)
    x = jax.random.normal(key, (4, 8, 8, 3))
    k = jax.random.key(5)
    jitted = _forward(nnx.clone(functional), x, k, True)
    np.testing.assert_array_equal(np.asarray(_forward(nnx.clone(model), x, k, True)), np.asarray(jitted))
    eager = nnx.clone(functional)(x, train=True, key=k)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-5, atol=1e-5)


def test_warmup_sets_the_scale_in_model_state():
    method = StochasticDepth("ResNetBasicBlock", drop_rate=0.4, drop_warmup=0.5)
    model = nnx.clone(_cifar())
    from jaxcomposer.models.tasks import ComposerClassifier
    task = method.model(ComposerClassifier(model, num_classes=10), StepCtx(step=0, run=RunInfo(total_steps=8)))
    assert isinstance(model.blocks[0].drop_warmup_scale, DropWarmupScale)
    state = task.state
    seen = []

    def grad_fn(params, model_state, batch, key):
        seen.append([float(v) for p, v in jax.tree_util.tree_flatten_with_path(model_state)[0]
                     if "drop_warmup_scale" in jax.tree_util.keystr(p)])
        return (0.0, model_state), params

    for step, expected in [(0, 0.0), (2, 0.5), (4, 1.0), (7, 1.0)]:
        ctx = StepCtx(step=jnp.asarray(step, jnp.int32), run=RunInfo(total_steps=8))
        method.grad(grad_fn, ctx)(task.params, state, None, None)
        assert seen[-1] == [expected] * 3
    ba = StochasticDepth("ResNetBasicBlock", drop_warmup="4ba")
    ba.grad(grad_fn, StepCtx(step=jnp.asarray(1), run=RunInfo(total_steps=100)))(task.params, state, None, None)
    assert seen[-1] == [0.25] * 3


def test_torch_surgery_in_place_order_and_warmup_buffer():
    def down(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 1, 2, bias=False), nn.BatchNorm2d(o))
    model = nn.Sequential(nn.Sequential(BasicBlock_(4, 4), BasicBlock_(4, 8, 2, down(4, 8))), BasicBlock_(8, 8),
                          _torch_bottleneck())
    blocks = [model[0][0], model[0][1], model[1]]
    same, count = apply_stochastic_depth_torch(model, "ResNetBasicBlock", "block", 0.3, "linear", warmup=True)
    assert same is model and count == 3
    np.testing.assert_allclose([float(b.drop_rate) for b in blocks], [0.1, 0.2, 0.3], rtol=1e-6)
    assert "0.0.drop_warmup_scale" in model.state_dict() and not hasattr(model[2], "drop_rate")
    with pytest.warns(NoEffectWarning, match="no ResNetBottleneck"):
        apply_stochastic_depth(nn.Sequential(BasicBlock_(4, 4)), "ResNetBottleneck")
    assert apply_stochastic_depth(model, "ResNetBottleneck") is model
    assert float(model[2].drop_rate) == pytest.approx(0.2)


def test_errors_and_warnings():
    with pytest.raises(ValueError, match=r"'ResNetBottleneck', 'ResNetBasicBlock'"):
        StochasticDepth("Bottleneck")
    with pytest.raises(ValueError, match="target_layer_name"):
        apply_stochastic_depth(_cifar(), "BasicBlock")
    with pytest.raises(ValueError, match="stochastic_method"):
        StochasticDepth("ResNetBasicBlock", stochastic_method="layer")
    for bad in (-0.1, 1.5, "0.2"):
        with pytest.raises(ValueError, match="drop_rate"):
            StochasticDepth("ResNetBasicBlock", drop_rate=bad)
    with pytest.raises(ValueError, match="drop_distribution"):
        StochasticDepth("ResNetBasicBlock", drop_distribution="quadratic")
    for bad in (-0.5, 2.0, "2dur", "10ep"):
        with pytest.raises(ValueError, match="drop_warmup"):
            StochasticDepth("ResNetBasicBlock", drop_warmup=bad)
    with pytest.raises(ValueError, match="'sample'"):
        StochasticDepth("ResNetBasicBlock", "sample", drop_warmup=0.1)
    with pytest.warns(NoEffectWarning, match="drop_rate is 0"):
        StochasticDepth("ResNetBasicBlock", drop_rate=0.0)
    with pytest.warns(NoEffectWarning, match="no ResNetBottleneck"):
        new = apply_stochastic_depth(_cifar(), "ResNetBottleneck")
    assert [type(b) for b in new.blocks] == [BasicBlock] * 3
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_stochastic_depth(object(), "ResNetBasicBlock")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StochasticDepth("ResNetBasicBlock", drop_warmup="0.25dur")


# (4) inside the Trainer -----------------------------------------------------------------------------------------

def _trainer(task, methods, **kw):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    return Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=96), 32, seed=0),
                   optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=methods, seed=0,
                   progress_bar=False, devices=jax.devices()[:1], **kw)


def _bits(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_nnx_resnet_trains_and_resumes_bitwise(tmp_path):
    """Composer xfails resumption for StochasticDepth (torch's global generator); here drops come from the step key."""
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.models.tasks import ComposerClassifier

    def task():
        return ComposerClassifier(ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0)),
                                  num_classes=10)

    def method():
        return StochasticDepth("ResNetBasicBlock", "sample", drop_rate=0.5)

    logger = InMemoryLogger()
    straight_task = task()
    straight = _trainer(straight_task, [method()], max_duration="3ba", loggers=[logger], save_folder=tmp_path,
                        save_interval="2ba")
    straight.fit()
    straight.close()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 3 and np.all(np.isfinite(losses))
    assert straight.state.model is straight_task.source
    assert isinstance(straight_task.source.blocks[0], StochasticBasicBlock)
    resumed = _trainer(task(), [method()], max_duration="3ba", load_path=tmp_path / "2")
    assert resumed.state.timestamp.batch == 2
    resumed.fit()
    a, b = _bits(straight.state.train_state), _bits(resumed.state.train_state)
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


class _ToNCHW(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(x.mean((2, 3)))


def test_trains_bridged_torch_resnet_with_warmup():
    from jaxcomposer.models.tasks import ComposerClassifier

    torch.manual_seed(0)
    # a stride-1 projection: the weight gradient of a 1x1 stride-2 conv through torch_bridge's oneDNN kernel
    # corrupts the heap under OMP_NUM_THREADS=1 (conftest's setting), with or without this method
    down = nn.Sequential(nn.Conv2d(4, 8, 1, 1, bias=False), nn.BatchNorm2d(8))
    module = nn.Sequential(_ToNCHW(), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), BasicBlock_(4, 4),
                           BasicBlock_(4, 8, 1, down), _Head())
    trainer = _trainer(ComposerClassifier(module, num_classes=10),
                       [StochasticDepth("ResNetBasicBlock", drop_rate=0.5, drop_warmup="1ba")], max_duration="2ba")
    trainer.fit()
    assert trainer.state.model.module is module and float(module[4].drop_rate) == 0.5
    scale = {k: v for k, v in trainer.state.train_state.model_state.items() if k.endswith("drop_warmup_scale")}
    assert sorted(scale) == ["3.drop_warmup_scale", "4.drop_warmup_scale"]
    assert all(float(v) == 1.0 for v in scale.values())  # step 1 of a 1-batch warmup: the full rate
    # the torch module computes what the trainer's eval forward computes (each branch scaled by 1 - p)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
