import copy
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

import torch_bridge.kernels
from torch_bridge.mirrors import TorchResNetCIFAR
from jaxcomposer import algorithms
from jaxcomposer.algorithms import ChannelsLast, apply_channels_last
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import ResNetCIFAR
from jaxcomposer.models.tasks import ComposerClassifier
from tests.algorithms.algo_testing import Example
from torch_bridge import from_torch
from torch_bridge.module import CHANNELS_LAST_ATTR

# The contract's model is a native NNX ResNet: NHWC already, so the method warns and leaves it as it is.
EXAMPLE = Example(lambda: algorithms.ChannelsLast())

# stablehlo's convolution dimension numbers: channels-last (Flax's, the switch) and channels-first (torch's)
NHWC_CONV = "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]"
NCHW_CONV = "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]"


@pytest.fixture
def xla_convs(monkeypatch):
    """The bridge's XLA convolution path (oneDNN off): the path the switch changes, as on GPU/TPU."""
    monkeypatch.setattr(torch_bridge.kernels, "available", lambda: False)


class _Mixed(nn.Module):
    """Every convolution kind the switch touches: 2-D (strided, grouped, dilated), transposed 2-D, 1-D."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2, bias=False)
        self.up = nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.conv1d = nn.Conv1d(4, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = self.up(self.grouped(y))  # (B, 4, H, W)
        return self.conv1d(y.flatten(2)).mean(-1)  # (B, 6)


def _tiny_resnet():
    torch.manual_seed(0)
    return TorchResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1)


def _conv_dims(hlo: str) -> set[str]:
    return set(re.findall(r"stablehlo\.convolution.*?dim_numbers = (\[[^\]]*\]x\[[^\]]*\]->\[[^\]]*\])", hlo))


# (1) native NNX: nothing to change ------------------------------------------------------------------------------

def test_nnx_model_is_left_as_it_is_with_a_warning():
    model = ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))
    with pytest.warns(NoEffectWarning, match="ChannelsLast did not change ResNetCIFAR: .*NHWC"):
        new = apply_channels_last(model)
    assert new is not model  # a clone, as the other surgeries' functional forms
    for a, b in zip(jax.tree_util.tree_leaves(nnx.state(model)), jax.tree_util.tree_leaves(nnx.state(new))):
        np.testing.assert_array_equal(a, b)
    with pytest.warns(NoEffectWarning):
        assert apply_channels_last(model, inplace=True) is model
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_channels_last(object())


# (2) torch surgery: Composer's memory format change, in place, plus the bridge marker -----------------------------

def test_torch_surgery_in_place_converts_and_marks():
    module = _tiny_resnet()
    before = copy.deepcopy(module.state_dict())
    conv = next(m for m in module.modules() if isinstance(m, nn.Conv2d) and m.in_channels > 1)  # not 1xCx3x3
    weight = conv.weight
    assert not weight.is_contiguous(memory_format=torch.channels_last) and not hasattr(module, CHANNELS_LAST_ATTR)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a CNN changes: no warning
        assert apply_channels_last(module) is module
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert getattr(module, CHANNELS_LAST_ATTR) is True
    for name, value in module.state_dict().items():  # the values and names are unchanged
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    x = torch.randn(2, 1, 8, 8)
    assert from_torch(module, (x,), modes=(False,)).conv_layout == "NHWC"
    assert from_torch(module, (x,), modes=(False,), conv_layout="NCHW").conv_layout == "NCHW"  # an explicit choice wins
    wrapper = nn.Sequential(module)  # a marked submodule is enough (TorchComposerTask wraps the user's module)
    assert from_torch(wrapper, (x,), modes=(False,)).conv_layout == "NHWC"
    assert from_torch(_tiny_resnet(), (x,), modes=(False,)).conv_layout == "NHWC"  # the default, marked or not
    with pytest.raises(ValueError, match="conv_layout must be"):
        from_torch(module, (x,), conv_layout="NDHWC")


def test_torch_module_without_convolutions_warns_and_is_not_marked():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    with pytest.warns(NoEffectWarning, match="ChannelsLast did not change any convolution of Sequential"):
        assert apply_channels_last(mlp) is mlp
    assert not hasattr(mlp, CHANNELS_LAST_ATTR)


# (3) the bridge's layout switch: same numbers, NHWC convolutions in the compiled program -------------------------

def _forward_and_grads(bridged, x, cotangent):
    def loss(params, buffers):
        out, new_buffers = bridged.apply(params, buffers, None, x, train=True)
        return jnp.sum(out * cotangent), (out, new_buffers)

    return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("make, shape", [(_tiny_resnet, (4, 1, 8, 8)), (_Mixed, (2, 3, 9, 9))],
                         ids=["resnet", "mixed_convs"])
def test_switch_keeps_outputs_and_gradients_and_convolves_nhwc(xla_convs, make, shape):
    module = make()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    plain = from_torch(copy.deepcopy(module), (torch.from_numpy(x),), modes=(True,), conv_layout="NCHW")
    switched = from_torch(apply_channels_last(module), (torch.from_numpy(x),), modes=(True,))
    assert (plain.conv_layout, switched.conv_layout) == ("NCHW", "NHWC")
    out_shape = jax.eval_shape(lambda p, b: plain.apply(p, b, None, x, train=True)[0], plain.params, plain.buffers)
    cotangent = np.random.default_rng(1).standard_normal(out_shape.shape).astype(np.float32)

    results = {}
    for name, bridged in (("plain", plain), ("switched", switched)):
        step = _forward_and_grads(bridged, x, cotangent)
        hlo = step.lower(bridged.params, bridged.buffers).as_text()
        results[name] = (step(bridged.params, bridged.buffers), _conv_dims(hlo))
    (_, (out_p, buf_p)), grads_p = results["plain"][0]
    (_, (out_s, buf_s)), grads_s = results["switched"][0]
    np.testing.assert_allclose(out_s, out_p, rtol=1e-5, atol=1e-5 * float(np.abs(out_p).max()))
    for name in grads_p:  # each layer at its own scale
        scale = float(np.abs(grads_p[name]).max()) or 1.0
        np.testing.assert_allclose(grads_s[name], grads_p[name], rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    for name in buf_p:
        np.testing.assert_allclose(buf_s[name], buf_p[name], rtol=1e-5, atol=1e-6, err_msg=name)

    # the forward's 2-D convolutions: NCHW as exported, NHWC with the switch (the backward's own dimension
    # numbers are XLA's transposes of these)
    plain_dims, switched_dims = results["plain"][1], results["switched"][1]
    assert NCHW_CONV in plain_dims and NHWC_CONV not in plain_dims
    assert NHWC_CONV in switched_dims and NCHW_CONV not in switched_dims
    if make is _Mixed:  # the 1-D convolution switches too
        assert "[b, f, 0]x[o, i, 0]->[b, f, 0]" in plain_dims and "[b, 0, f]x[0, i, o]->[b, 0, f]" in switched_dims


# (4) the method and the Trainer ---------------------------------------------------------------------------------

def test_method_equals_functional_and_edits_in_place():
    functional = apply_channels_last(_tiny_resnet())
    module = _tiny_resnet()
    task = ComposerClassifier.for_module(module, num_classes=10)
    method = ChannelsLast()
    assert method.name == "ChannelsLast" and method.model is not None and method.batch is None
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is module and getattr(module, CHANNELS_LAST_ATTR) is True
    for (name, a), (_, b) in zip(functional.named_parameters(), module.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert a.stride() == b.stride(), name  # the same memory format
    nnx_model = ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))
    with pytest.warns(NoEffectWarning):
        nnx_task = method.model(ComposerClassifier(nnx_model, num_classes=10), StepCtx(step=0, run=RunInfo(2)))
    assert nnx_task.source is nnx_model


class _ToNCHW(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


class _GlobalMean(nn.Module):
    def forward(self, x):
        return x.mean((2, 3))


def test_trains_bridged_torch_cnn_in_trainer(xla_convs):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    torch.manual_seed(0)
    module = nn.Sequential(_ToNCHW(), nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
                           nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), _GlobalMean(), nn.Linear(32, 10))
    logger = InMemoryLogger()
    trainer = Trainer(model=ComposerClassifier(module, num_classes=10),
                      train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0), max_duration="2ba",
                      optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=[ChannelsLast()], seed=0,
                      progress_bar=False, devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    # as Composer: the user's module was converted in place, trained, and holds the trained weights
    assert trainer.state.model.module is module and module[1].weight.is_contiguous(memory_format=torch.channels_last)
    assert trainer.task.pure.bridged.conv_layout == "NHWC"
    np.testing.assert_array_equal(module[3].weight.detach().numpy(), trainer.state.train_state.params["3.weight"])
    # the torch module (channels-last, eager) computes what the trainer's jitted NHWC forward computes
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
