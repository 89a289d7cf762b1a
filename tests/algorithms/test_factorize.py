import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from torch import nn

from torch_bridge.mirrors import TorchResNetCIFAR
from jaxcomposer import algorithms
from jaxcomposer.algorithms import Factorize, apply_factorization
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.factorize import (FactorizedConv, FactorizedLinear, clean_latent_size,
                                              factorizing_could_speedup, max_rank_with_possible_speedup)
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import MLP, ResNetCIFAR
from torch_bridge.methods.factorize import FactorizedConv2d, FactorizedLinear as TorchFactorizedLinear
from torch_bridge.methods.factorize import factorizing_could_speedup_torch
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# the contract's ResNetCIFAR(width=4) has 4-, 8- and 16-channel convs and a 16 -> 10 head
EXAMPLE = Example(lambda: algorithms.Factorize(min_channels=4, min_features=8, latent_features=0.25),
                  surgery=FactorizedConv)


def _resnet():
    return ResNetCIFAR(depth=8, width=4, num_classes=10, in_channels=1, rngs=nnx.Rngs(0))


@functools.cache
def _jit_call():
    return nnx.jit(lambda m, x: m(x))


# (1) the speedup rule -------------------------------------------------------------------------------------------

def test_speedup_rule_by_hand():
    # breakeven = fan_in * out / (fan_in + out); max rank = ceil(breakeven - 1)
    assert max_rank_with_possible_speedup(512, 512) == 255  # 256 exactly: one lower
    assert max_rank_with_possible_speedup(512, 512, (3, 3)) == math.ceil(4608 * 512 / 5120 - 1) == 460
    assert max_rank_with_possible_speedup(4, 4, (1, 1)) == 1
    assert max_rank_with_possible_speedup(16, 10) == 6  # 160 / 26 = 6.15
    assert clean_latent_size(0.25, 512, 256) == 64 and clean_latent_size(0.01, 8, 8) == 1
    assert clean_latent_size(128, 512, 512) == 128
    conv = nnx.Conv(4, 4, (1, 1), rngs=nnx.Rngs(0))
    assert factorizing_could_speedup(conv, 0.25) and not factorizing_could_speedup(conv, 0.5)
    assert not factorizing_could_speedup(nnx.Conv(8, 8, (3, 3), feature_group_count=2, rngs=nnx.Rngs(0)), 0.25)
    assert factorizing_could_speedup(nnx.Linear(512, 512, rngs=nnx.Rngs(0)), 255)
    assert not factorizing_could_speedup(nnx.Linear(512, 512, rngs=nnx.Rngs(0)), 256)


def test_rule_agrees_with_torch_rule():
    for cin, cout, k, latent in [(4, 4, 1, 0.25), (4, 4, 1, 0.5), (8, 16, 3, 0.25), (64, 64, 3, 60), (64, 64, 1, 32),
                                 (64, 64, 1, 31), (3, 64, 7, 0.9), (256, 64, 5, 63)]:
        j = nnx.Conv(cin, cout, (k, k), rngs=nnx.Rngs(0))
        t = nn.Conv2d(cin, cout, k)
        assert factorizing_could_speedup(j, latent) == factorizing_could_speedup_torch(t, latent), (cin, cout, k)
        jl, tl = nnx.Linear(cin, cout, rngs=nnx.Rngs(0)), nn.Linear(cin, cout)
        assert factorizing_could_speedup(jl, latent) == factorizing_could_speedup_torch(tl, latent), (cin, cout)


# (2) the layers -------------------------------------------------------------------------------------------------

def _copy_conv(j: nnx.Conv, t: nn.Conv2d):
    j.kernel[...] = jnp.asarray(t.weight.detach().numpy().transpose(2, 3, 1, 0))  # OIHW -> HWIO
    if t.bias is not None:
        j.bias[...] = jnp.asarray(t.bias.detach().numpy())


def _copy_linear(j: nnx.Linear, t: nn.Linear):
    j.kernel[...] = jnp.asarray(t.weight.detach().numpy().T)
    if t.bias is not None:
        j.bias[...] = jnp.asarray(t.bias.detach().numpy())


def test_factorized_conv_matches_torch():
    torch.manual_seed(0)
    tconv = nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False)
    jconv = nnx.Conv(8, 12, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)), use_bias=False, rngs=nnx.Rngs(0))
    tf = FactorizedConv2d.from_conv2d(tconv, 0.25)
    jf = FactorizedConv(jconv, 0.25, rngs=nnx.Rngs(1))
    assert tf.latent_size == jf.latent_size == 2
    assert jf.module0.kernel[...].shape == (3, 3, 8, 2) and jf.module0.bias is None
    assert jf.module1.kernel[...].shape == (1, 1, 2, 12) and jf.module1.bias is not None  # bias=True, as Composer
    assert tf.module0.bias is None and tf.module1.bias is not None and tf.module0.stride == (2, 2)
    _copy_conv(jf.module0, tf.module0)
    _copy_conv(jf.module1, tf.module1)
    x = np.random.default_rng(0).standard_normal((2, 8, 9, 9)).astype(np.float32)
    with torch.no_grad():
        ref = tf(torch.from_numpy(x)).numpy()
        # the pair is the two convs one after the other, no nonlinearity
        direct = tf.module1(tf.module0(torch.from_numpy(x))).numpy()
    np.testing.assert_array_equal(ref, direct)
    out = _jit_call()(jf, jnp.asarray(x.transpose(0, 2, 3, 1)))
    np.testing.assert_allclose(np.asarray(out).transpose(0, 3, 1, 2), ref, rtol=1e-5, atol=1e-5)


def test_factorized_linear_matches_torch():
    torch.manual_seed(0)
    tf = TorchFactorizedLinear.from_linear(nn.Linear(16, 10), 0.25)
    jf = FactorizedLinear(nnx.Linear(16, 10, rngs=nnx.Rngs(0)), 0.25, rngs=nnx.Rngs(1))
    assert tf.latent_size == jf.latent_size == 2 and jf.module0.bias is None and jf.module1.bias is not None
    assert FactorizedLinear(nnx.Linear(16, 10, use_bias=False, rngs=nnx.Rngs(0)), 2, rngs=nnx.Rngs(1)).module1.bias \
        is None
    _copy_linear(jf.module0, tf.module0)
    _copy_linear(jf.module1, tf.module1)
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    with torch.no_grad():
        ref = tf(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(_jit_call()(jf, jnp.asarray(x))), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not small enough"):
        TorchFactorizedLinear(16, 10, latent_features=7)


def test_fresh_init_follows_torch_default_bounds():
    # Composer re-initializes (reset_parameters): U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases
    jf = FactorizedConv(nnx.Conv(64, 64, (3, 3), rngs=nnx.Rngs(0)), 0.25, rngs=nnx.Rngs(1))
    torch.manual_seed(0)
    tf = FactorizedConv2d.from_conv2d(nn.Conv2d(64, 64, 3), 0.25)
    for j, t, fan_in in [(jf.module0.kernel[...], tf.module0.weight, 64 * 9),
                         (jf.module1.kernel[...], tf.module1.weight, 16),
                         (jf.module1.bias[...], tf.module1.bias, 16)]:
        bound = 1 / math.sqrt(fan_in)
        j, t = np.asarray(j), t.detach().numpy()
        assert np.abs(j).max() <= bound and np.abs(t).max() <= bound
        assert np.abs(j).max() > 0.8 * bound and np.abs(t).max() > 0.8 * bound  # uniform over the whole range


# (3) surgery ----------------------------------------------------------------------------------------------------

def test_nnx_surgery_counts_match_torch_and_original_untouched():
    model = _resnet()
    before = [np.asarray(x) for x in jax.tree_util.tree_leaves(nnx.state(model))]
    new = apply_factorization(model, min_channels=4, min_features=8)
    # all convs but the 1 -> 4 stem (min(in, out) = 1 < 4), and the 16 -> 10 head
    assert sum(isinstance(m, FactorizedConv) for _, m in nnx.iter_graph(new)) == 8
    assert isinstance(new.head, FactorizedLinear) and isinstance(new.stem_conv, nnx.Conv)
    assert new.blocks[2].conv2.latent_size == 4 and new.blocks[1].proj_conv.module0.strides == (2, 2)
    assert not any(isinstance(m, (FactorizedConv, FactorizedLinear)) for _, m in nnx.iter_graph(model))
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(before, jax.tree_util.tree_leaves(nnx.state(model))))
    torch_model = TorchResNetCIFAR(depth=8, width=4, in_channels=1)
    same = apply_factorization(torch_model, min_channels=4, min_features=8)
    assert same is torch_model and count_module_instances(torch_model, FactorizedConv2d) == 8
    assert count_module_instances(torch_model, TorchFactorizedLinear) == 1
    # the thresholds: min_channels=8 keeps the 4-channel block 0 and the 4 -> 8 convs of block 1
    only_wide = apply_factorization(model, min_channels=8, factorize_linears=False)
    assert sum(isinstance(m, FactorizedConv) for _, m in nnx.iter_graph(only_wide)) == 4
    # a second application does not factorize the factorized layers' parts again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        twice = apply_factorization(new, min_channels=1, min_features=1)
    assert sum(isinstance(m, FactorizedConv) for _, m in nnx.iter_graph(twice)) == 9  # + the stem, now allowed


def test_jit_equals_eager_and_functional_equals_method():
    from jaxcomposer.models.tasks import ComposerClassifier
    key = jax.random.PRNGKey(3)
    model = _resnet()
    functional = apply_factorization(model, True, True, 4, 0.25, 8, 0.25, key=key)
    x = jax.random.normal(jax.random.key(1), (2, 8, 8, 1))
    run = nnx.jit(lambda m, x: m(x, train=False))
    np.testing.assert_allclose(np.asarray(functional(x, train=False)), np.asarray(run(functional, x)),
                               rtol=1e-5, atol=1e-5)
    task = ComposerClassifier(model, num_classes=10)
    method = Factorize(min_channels=4, min_features=8, latent_features=0.25)
    assert method.name == "Factorize" and method.model is not None
    new_task = method.model(task, StepCtx(step=0, key=key, run=RunInfo(total_steps=2)))
    assert new_task.source is model and isinstance(model.head, FactorizedLinear)
    np.testing.assert_array_equal(np.asarray(run(model, x)), np.asarray(run(functional, x)))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(new_task.params)[0]]
    assert any("['head']['module0']['kernel']" in p for p in paths)


def test_nothing_replaced_warns_and_validation():
    with pytest.warns(NoEffectWarning, match="did not change any layers"):
        apply_factorization(_resnet())  # defaults: 512 channels
    with pytest.warns(NoEffectWarning):
        apply_factorization(nn.Sequential(nn.Linear(8, 8)))
    with pytest.warns(NoEffectWarning):
        Factorize(factorize_convs=False, factorize_linears=False)
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_factorization(object())
    for kwargs in ({"latent_channels": 0}, {"latent_channels": 1.5}, {"latent_features": -2},
                   {"min_channels": -1}, {"min_features": 2.5}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            Factorize(**kwargs)
    mlp = MLP(16, hidden=(512,), num_classes=4, rngs=nnx.Rngs(0))
    assert sum(isinstance(m, FactorizedLinear) for _, m in nnx.iter_graph(
        apply_factorization(mlp, min_features=16, latent_features=0.25))) == 1  # 16 -> 512: latent 4


# (4) inside the Trainer -----------------------------------------------------------------------------------------

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
    trainer, losses = _fit(ComposerClassifier(module, num_classes=10),
                           [Factorize(min_channels=8, min_features=8, latent_features=0.25)])
    assert len(losses) == 2 and np.all(np.isfinite(losses))
    assert trainer.state.model.module is module and isinstance(module[3], FactorizedConv2d)
    assert isinstance(module[7], TorchFactorizedLinear) and isinstance(module[1], nn.Conv2d)
    names = set(trainer.task.pure.params)
    assert {"3.module0.weight", "3.module1.bias", "7.module0.weight"} <= names and "3.weight" not in names
    np.testing.assert_array_equal(module[3].module0.weight.detach().numpy(),
                                  trainer.state.train_state.params["3.module0.weight"])
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 1)).astype(np.float32)
    (ours,) = trainer.predict([{"input": x, "target": np.zeros(4, np.int32)}])
    with torch.no_grad():
        theirs = module.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
