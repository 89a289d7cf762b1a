import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flax import nnx
from torch import nn

from jaxcomposer import algorithms
from jaxcomposer.algorithms import WeightStandardization, apply_weight_standardization
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.weight_standardization import StandardizedConv, standardize_weights
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.core.model import from_nnx, param_use_order
from jaxcomposer.models import MLP, ResNetCIFAR
from torch_bridge.methods.weight_standardization import WeightStandardizer, apply_weight_standardization_torch
from tests.algorithms.algo_testing import Example

EXAMPLE = Example(lambda: algorithms.WeightStandardization(), surgery=StandardizedConv)


def _reference(w_oihw: np.ndarray) -> np.ndarray:
    """Composer's formula in float64: per output channel (axis 0), biased variance, eps 1e-10."""
    w = w_oihw.astype(np.float64)
    flat = w.reshape(w.shape[0], -1)
    mean, var = flat.mean(1), flat.var(1)
    return ((flat - mean[:, None]) / np.sqrt(var[:, None] + 1e-10)).reshape(w.shape)


def _resnet():
    return ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))


@functools.cache
def _jit_forward():
    return nnx.jit(lambda m, x: m(x, train=False))


# (1) numerics ---------------------------------------------------------------------------------------------------

def test_standardize_matches_numpy_and_torch():
    w = np.random.default_rng(0).standard_normal((6, 3, 3, 3)).astype(np.float32) * 3 + 0.5  # OIHW
    ref = _reference(w)
    ours = np.asarray(standardize_weights(jnp.asarray(w.transpose(2, 3, 1, 0)))).transpose(3, 2, 0, 1)  # HWIO
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(WeightStandardizer()(torch.from_numpy(w)).numpy(), ref, rtol=1e-5, atol=1e-6)
    flat = ours.reshape(6, -1)
    np.testing.assert_allclose(flat.mean(1), 0, atol=1e-6)
    np.testing.assert_allclose(flat.std(1), 1, atol=1e-5)


def test_nnx_conv_matches_parametrized_torch_conv_forward_and_grad():
    torch.manual_seed(0)
    tconv = nn.Conv2d(3, 5, 3, padding=1, bias=True)
    jconv = nnx.Conv(3, 5, (3, 3), padding=((1, 1), (1, 1)), rngs=nnx.Rngs(0))
    jconv.kernel[...] = jnp.asarray(tconv.weight.detach().numpy().transpose(2, 3, 1, 0))
    jconv.bias[...] = jnp.asarray(tconv.bias.detach().numpy())
    apply_weight_standardization_torch(nn.Sequential(tconv))
    wrapped = StandardizedConv(jconv)
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 6)).astype(np.float32)
    tx = torch.from_numpy(x)
    ty = tconv(tx)
    ty.square().sum().backward()
    jx = jnp.asarray(x.transpose(0, 2, 3, 1))
    np.testing.assert_allclose(np.asarray(_jit_forward_conv()(wrapped, jx)).transpose(0, 3, 1, 2),
                               ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    # the stored weight stays raw, in both
    np.testing.assert_array_equal(np.asarray(wrapped.conv.kernel[...]).transpose(3, 2, 0, 1),
                                  tconv.parametrizations.weight.original.detach().numpy())
    grads = nnx.grad(lambda m: jnp.square(m(jx)).sum())(wrapped)
    ours, theirs = np.asarray(grads.conv.kernel[...]).transpose(3, 2, 0, 1), tconv.parametrizations.weight.original.grad
    scale = np.abs(theirs.numpy()).max()  # float32 sums of a loss this size: compare relative to the gradient's size
    np.testing.assert_allclose(ours / scale, theirs.numpy() / scale, atol=1e-5)


@functools.cache
def _jit_forward_conv():
    return nnx.jit(lambda m, x: m(x))


def test_jit_equals_eager():
    model, _ = apply_weight_standardization(_resnet())
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 1))
    np.testing.assert_allclose(np.asarray(model(x, train=False)), np.asarray(_jit_forward()(model, x)),
                               rtol=1e-5, atol=1e-5)


# (2) surgery ----------------------------------------------------------------------------------------------------

def test_nnx_surgery_counts_order_and_original_untouched():
    model = _resnet()
    new, count = apply_weight_standardization(model)
    assert count == 9 and sum(isinstance(m, StandardizedConv) for _, m in nnx.iter_graph(new)) == 9
    assert not any(isinstance(m, StandardizedConv) for _, m in nnx.iter_graph(model))
    np.testing.assert_array_equal(np.asarray(new.stem_conv.conv.kernel[...]), np.asarray(model.stem_conv.kernel[...]))
    # the last two convs the forward reads are left alone: block 2's conv2 and projection shortcut
    pure = from_nnx(model)
    order = param_use_order(lambda p, s, b, train, key: pure.apply(p, s, b, train=train, key=key), pure.params,
                            pure.state, jnp.zeros((2, 8, 8, 1)))
    conv_paths = [p[:-1] for p in order if p[-1] == "kernel" and p[0] != "head"]
    assert conv_paths[-2:] == [("blocks", "2", "conv2"), ("blocks", "2", "proj_conv")]
    new2, count2 = apply_weight_standardization(model, 2)
    assert count2 == 7
    assert isinstance(new2.blocks[2].conv2, nnx.Conv) and isinstance(new2.blocks[2].proj_conv, nnx.Conv)
    assert isinstance(new2.blocks[2].conv1, StandardizedConv) and isinstance(new2.stem_conv, StandardizedConv)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert apply_weight_standardization(new2, 0)[1] == 2  # only the two left; never wrapped twice
    assert apply_weight_standardization(model, 3, inplace=True) == 6 and isinstance(model.stem_conv,
                                                                                     StandardizedConv)


class _CallOrderDiffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Conv2d(4, 2, 1)  # defined first, called last
        self.body = nn.Conv2d(1, 4, 3)

    def forward(self, x):
        return self.head(F.relu(self.body(x)))


def test_torch_surgery_follows_fx_call_order_in_place():
    model = _CallOrderDiffers()
    weight = model.body.weight.detach().clone()
    assert apply_weight_standardization(model, 1) == 1
    assert parametrize_names(model) == ["body"]  # the last conv *called* is left alone, as Composer's fx order
    np.testing.assert_array_equal(model.body.parametrizations.weight.original.detach().numpy(), weight.numpy())
    np.testing.assert_allclose(model.body.weight.detach().numpy(), _reference(weight.numpy()), rtol=1e-5,
                               atol=1e-6)
    assert apply_weight_standardization(_CallOrderDiffers(), 0) == 2
    with pytest.warns(NoEffectWarning):
        assert apply_weight_standardization(_CallOrderDiffers(), 5) == 0


def parametrize_names(model):
    return [n for n, m in model.named_modules() if torch.nn.utils.parametrize.is_parametrized(m)]


def test_nothing_standardized_warns_and_validation():
    with pytest.warns(NoEffectWarning, match="no convolution"):
        apply_weight_standardization(MLP(16, hidden=(8,), num_classes=4, rngs=nnx.Rngs(0)))
    with pytest.warns(NoEffectWarning):
        apply_weight_standardization(_resnet(), 9)
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_weight_standardization(object())
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n_last_layers_ignore"):
            WeightStandardization(bad)


def test_method_equals_functional_and_edits_in_place():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = _resnet()
    functional, _ = apply_weight_standardization(model, 1)
    task = ComposerClassifier(model, num_classes=10)
    method = WeightStandardization(1)
    assert method.name == "WeightStandardization" and method.model is not None
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is model and isinstance(model.stem_conv, StandardizedConv)
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
    np.testing.assert_array_equal(np.asarray(_jit_forward()(model, x)), np.asarray(_jit_forward()(functional, x)))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_task.params)[0]]
    assert any("['stem_conv']['conv']['kernel']" in p for p in paths)


# (3) inside the Trainer -----------------------------------------------------------------------------------------

def _fit(task, methods):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0),
                      max_duration="2ba", optimizers=DecoupledSGDW(lr=0.05, momentum=0.9), algorithms=methods,
                      seed=0, progress_bar=False, devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    return trainer, [v for _, v in logger.data["loss/train/total"]]


class _ToNCHW(nn.Module):
    def forward(self, x):
        return x.permute(0, 3, 1, 2)


def test_trains_bridged_torch_cnn():
    from jaxcomposer.models.tasks import ComposerClassifier

    torch.manual_seed(0)
    module = nn.Sequential(_ToNCHW(), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                           nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    raw = module[1].weight.detach().clone()
    trainer, losses = _fit(ComposerClassifier(module, num_classes=10), [WeightStandardization()])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model.module is module and parametrize_names(module) == ["1", "3"]
    names = set(trainer.task.pure.params)
    assert "1.parametrizations.weight.original" in names and "1.weight" not in names
    trained = module[1].parametrizations.weight.original.detach().numpy()
    assert not np.array_equal(trained, raw.numpy())  # the raw weight is the trained parameter
    np.testing.assert_array_equal(trained, trainer.state.train_state.params["1.parametrizations.weight.original"])
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
