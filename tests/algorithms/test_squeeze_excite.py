import copy
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
from jaxcomposer.algorithms import SqueezeExcite, apply_squeeze_excite
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.squeeze_excite import SqueezeExcite2d, SqueezeExciteConv, latent_width
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import MLP, ResNetCIFAR
from tests.algorithms.algo_testing import Example
from torch_bridge.methods.squeeze_excite import SqueezeExciteConv2d, apply_squeeze_excite_torch
from torch_bridge.surgery import count_module_instances

# the contract's ResNetCIFAR(width=4) has 4-, 8- and 16-channel convs: min_channels=8 wraps the last two stages
EXAMPLE = Example(lambda: algorithms.SqueezeExcite(latent_channels=4, min_channels=8), surgery=SqueezeExciteConv)


def _se_count(m) -> int:
    return sum(isinstance(x, SqueezeExciteConv) for _, x in nnx.iter_graph(m))


def _params(m) -> list[np.ndarray]:
    return [np.asarray(v) for v in jax.tree_util.tree_leaves(nnx.state(m))]


@functools.cache
def _resnet() -> ResNetCIFAR:
    return ResNetCIFAR(depth=8, width=8, num_classes=10, in_channels=3, rngs=nnx.Rngs(0))


@nnx.jit
def _eval_forward(model, x):
    return model(x, train=False)


# (1) numerics ---------------------------------------------------------------------------------------------------

def test_latent_width_as_composer():
    assert latent_width(64, 16) == 64 and latent_width(0.25, 16) == 4 and latent_width(0.3, 16) == 4


def test_se_block_matches_numpy_reference(key):
    se = SqueezeExcite2d(6, latent_channels=3, rngs=nnx.Rngs(0))
    x = np.asarray(jax.random.normal(key, (2, 5, 4, 6)))
    w1, w2 = np.asarray(se.fc1.kernel[...]), np.asarray(se.fc2.kernel[...])
    assert w1.shape == (6, 3) and w2.shape == (3, 6) and se.fc1.bias is None and se.fc2.bias is None
    bound = 1 / np.sqrt(6)  # torch's nn.Linear default init: uniform in +-1/sqrt(fan_in)
    assert np.abs(w1).max() <= bound and np.abs(w1).max() > 0.5 * bound
    hidden = np.maximum(x.mean(axis=(1, 2)) @ w1, 0)
    ref = x * (1 / (1 + np.exp(-(hidden @ w2))))[:, None, None, :]
    np.testing.assert_allclose(np.asarray(jax.jit(lambda v: se(v))(jnp.asarray(x))), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("latent", [3, 0.5])
def test_nnx_se_conv_matches_torch(latent):
    torch.manual_seed(0)
    tconv = nn.Conv2d(5, 6, 3, stride=2, padding=1, bias=True)
    tse = SqueezeExciteConv2d.from_conv2d(tconv, 0, latent_channels=latent)
    jconv = nnx.Conv(5, 6, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), use_bias=True, rngs=nnx.Rngs(0))
    jconv.kernel[...] = jnp.asarray(tconv.weight.detach().numpy().transpose(2, 3, 1, 0))  # OIHW -> HWIO
    jconv.bias[...] = jnp.asarray(tconv.bias.detach().numpy())
    jse = SqueezeExciteConv(jconv, latent, rngs=nnx.Rngs(1))
    assert jse.se.latent_channels == tse.se.latent_channels == 3
    jse.se.fc1.kernel[...] = jnp.asarray(tse.se.pool_and_mlp[2].weight.detach().numpy().T)  # (out, in) -> (in, out)
    jse.se.fc2.kernel[...] = jnp.asarray(tse.se.pool_and_mlp[4].weight.detach().numpy().T)
    x = torch.randn(3, 5, 9, 8)
    with torch.no_grad():
        ref = tse(x).numpy()
    out = jax.jit(lambda v: jse(v))(jnp.asarray(x.numpy().transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(out).transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-5)
    assert set(tse.state_dict()) == {"conv.weight", "conv.bias", "se.pool_and_mlp.2.weight",
                                     "se.pool_and_mlp.4.weight"}  # Composer's keys


# (2) surgery ----------------------------------------------------------------------------------------------------

def test_nnx_surgery_counts_and_original_untouched(key):
    model = _resnet()
    before = _params(model)
    x = jax.random.normal(key, (2, 8, 8, 3))
    y0 = _eval_forward(model, x)
    new = apply_squeeze_excite(model, latent_channels=4, min_channels=16)
    # width 8, depth 8: stem 3->8, block0 8->8 (x2), block1 8->16 (conv1, proj: min 8), conv2 16->16,
    # block2 16->32 conv1 + proj (min 16), conv2 32->32. min(in, out) >= 16: block1.conv2, block2.{conv1,conv2,proj}
    assert _se_count(new) == 4
    assert isinstance(new.blocks[1].conv2, SqueezeExciteConv) and isinstance(new.blocks[1].conv1, nnx.Conv)
    assert all(isinstance(getattr(new.blocks[2], n), SqueezeExciteConv) for n in ("conv1", "conv2", "proj_conv"))
    assert new.blocks[2].conv1.se.latent_channels == 4
    assert _se_count(model) == 0 and all(np.array_equal(a, b) for a, b in zip(before, _params(model)))
    np.testing.assert_array_equal(np.asarray(new.blocks[2].conv1.conv.kernel[...]),
                                  np.asarray(model.blocks[2].conv1.kernel[...]))
    y1 = _eval_forward(new, x)
    assert y1.shape == y0.shape and not np.allclose(np.asarray(y1), np.asarray(y0))
    # jit equals eager on the surgered model (one eager forward of the tiny model)
    np.testing.assert_allclose(np.asarray(new(x, train=False)), np.asarray(y1), rtol=1e-5, atol=1e-6)
    # 2 new kernels per SE block
    n_params = lambda m: len(jax.tree_util.tree_leaves(nnx.state(m, nnx.Param)))
    assert n_params(new) == n_params(model) + 2 * 4
    # deterministic surgery, and a fraction of the out channels
    again = apply_squeeze_excite(model, latent_channels=4, min_channels=16)
    assert all(np.array_equal(a, b) for a, b in zip(_params(new), _params(again)))
    frac = apply_squeeze_excite(model, latent_channels=0.25, min_channels=16)
    assert frac.blocks[1].conv2.se.latent_channels == 4 and frac.blocks[2].conv2.se.latent_channels == 8
    # applying twice does not stack SE blocks (and does not warn: the model has SE blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twice = apply_squeeze_excite(new, latent_channels=4, min_channels=16)
    assert _se_count(twice) == 4


class _TorchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(32, 8, 1))
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        return self.fc(self.body(F.relu(self.stem(x))).mean((2, 3)))


def test_torch_surgery_in_place_as_composer():
    torch.manual_seed(0)
    model = _TorchNet()
    conv = model.body[0]
    same = apply_squeeze_excite(model, latent_channels=0.5, min_channels=16)
    assert same is model  # edited in place and returned, as Composer
    # stem: min(3, 16) = 3; body.0: min(16, 32) = 16 -> wrapped; body.2: min(32, 8) = 8
    assert count_module_instances(model, SqueezeExciteConv2d) == 1
    assert isinstance(model.body[0], SqueezeExciteConv2d) and model.body[0].conv is conv
    assert model.body[0].se.latent_channels == 16 and isinstance(model.stem, nn.Conv2d)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert model(x).shape == (2, 10)
    _, n = apply_squeeze_excite_torch(copy.deepcopy(_TorchNet()), latent_channels=4, min_channels=3)
    assert n == 3


def test_nothing_replaced_warns_and_errors():
    with pytest.warns(NoEffectWarning, match="did not change any layers"):
        new = apply_squeeze_excite(_resnet(), min_channels=1000)
    assert _se_count(new) == 0 and new is not _resnet()
    with pytest.warns(NoEffectWarning):
        apply_squeeze_excite(MLP(64, hidden=(32,), num_classes=10, rngs=nnx.Rngs(0)))
    with pytest.warns(NoEffectWarning):
        apply_squeeze_excite(_TorchNet())  # default min_channels=128
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_squeeze_excite(object())
    with pytest.raises(ValueError, match="hidden width of 0"):
        apply_squeeze_excite(_resnet(), latent_channels=0.01, min_channels=8)
    for bad in (0, -1, "64"):
        with pytest.raises(ValueError, match="latent_channels"):
            SqueezeExcite(latent_channels=bad)
    for bad in (-1, 2.5):
        with pytest.raises(ValueError, match="min_channels"):
            SqueezeExcite(min_channels=bad)


def test_method_edits_the_model_in_place_and_matches_functional(key):
    from jaxcomposer.models.tasks import ComposerClassifier
    model = nnx.clone(_resnet())
    task = ComposerClassifier(model, num_classes=10)
    method = SqueezeExcite(latent_channels=4, min_channels=16)
    assert method.name == "SqueezeExcite" and method.model is not None and method.batch is None
    new_task = method.model(task, StepCtx(step=0, run=RunInfo(total_steps=2)))
    assert new_task.source is model and _se_count(model) == 4
    functional = apply_squeeze_excite(_resnet(), 4, 16)
    x = jax.random.normal(key, (2, 8, 8, 3))
    np.testing.assert_array_equal(np.asarray(_eval_forward(model, x)), np.asarray(_eval_forward(functional, x)))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_task.params)[0]]
    assert any("['conv2']['conv']['kernel']" in p for p in paths)
    assert any("['conv2']['se']['fc1']['kernel']" in p for p in paths)


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


def test_trains_bridged_torch_cnn():
    from jaxcomposer.models.tasks import ComposerClassifier

    torch.manual_seed(0)
    module = nn.Sequential(  # NHWC digits (B, 8, 8, 1) in
        _ToNCHW(), nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        _GlobalMean(), nn.Linear(16, 10))
    trainer, losses = _fit(ComposerClassifier(module, num_classes=10), [SqueezeExcite(0.5, min_channels=8)])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model.module is module and isinstance(module[3], SqueezeExciteConv2d)
    names = set(trainer.task.pure.params)
    assert {"3.conv.weight", "3.se.pool_and_mlp.2.weight", "3.se.pool_and_mlp.4.weight"} <= names
    np.testing.assert_array_equal(module[3].se.pool_and_mlp[2].weight.detach().numpy(),
                                  trainer.state.train_state.params["3.se.pool_and_mlp.2.weight"])
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
