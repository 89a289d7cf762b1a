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
from jaxcomposer.algorithms import LowPrecisionGroupNorm, apply_low_precision_groupnorm
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.low_precision_groupnorm import LPGroupNorm
from jaxcomposer.core.method import RunInfo, StepCtx
from jaxcomposer.models import ResNetCIFAR
from torch_bridge.methods.low_precision_groupnorm import LPGroupNorm as TorchLPGroupNorm, to_lp_groupnorm
from torch_bridge.surgery import count_module_instances
from tests.algorithms.algo_testing import Example

# no GroupNorm in the contract's ResNetCIFAR (BatchNorm only): it warns NoEffectWarning there
EXAMPLE = Example(lambda: algorithms.LowPrecisionGroupNorm())

BF16 = jnp.bfloat16


def _bf16(v) -> np.ndarray:
    return np.asarray(jnp.asarray(v, jnp.float32).astype(BF16).astype(jnp.float32))


@functools.cache
def _apply(graphdef):
    return jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))


def _call(layer, x, dtype=None):
    """A jitted call of ``layer`` with its variables cast to ``dtype`` (as the Trainer's AMP casts params)."""
    graphdef, state = nnx.split(layer)
    if dtype is not None:
        state = jax.tree.map(lambda v: v.astype(dtype), state)
    return _apply(graphdef)(state, x)


def _torch_groupnorm(groups=4, channels=16, seed=0):
    torch.manual_seed(seed)
    layer = nn.GroupNorm(groups, channels)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(channels))
        layer.bias.copy_(torch.randn(channels))
    return layer


def _nnx_copy(tlayer, **kw) -> nnx.GroupNorm:
    layer = nnx.GroupNorm(tlayer.num_channels, tlayer.num_groups, epsilon=tlayer.eps, rngs=nnx.Rngs(0), **kw)
    layer.scale[...] = jnp.asarray(tlayer.weight.detach().numpy())
    layer.bias[...] = jnp.asarray(tlayer.bias.detach().numpy())
    return layer


def test_bf16_numerics_match_numpy_and_torch_autocast():
    tgn = _torch_groupnorm()
    x = torch.randn(2, 16, 5, 6) * 3 + 1  # NCHW
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_torch = to_lp_groupnorm(tgn, 0)(x)
    assert y_torch.dtype == torch.bfloat16
    y = _call(LPGroupNorm.from_group_norm(_nnx_copy(tgn)), jnp.asarray(x.numpy().transpose(0, 2, 3, 1)), BF16)
    assert y.dtype == BF16
    y = np.asarray(y.astype(jnp.float32)).transpose(0, 3, 1, 2)
    # reference: inputs and weights rounded to bf16, statistics per (example, group) in float64, rounded once
    xr, w, b = _bf16(x.numpy()), _bf16(tgn.weight.detach().numpy()), _bf16(tgn.bias.detach().numpy())
    g = xr.reshape(2, 4, -1).astype(np.float64)
    normed = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(xr.shape)
    ref = _bf16((normed * w[:, None, None] + b[:, None, None]).astype(np.float32))
    np.testing.assert_array_equal(y, ref)
    np.testing.assert_array_equal(y_torch.float().detach().numpy(), ref)


def test_fp32_is_bit_identical_to_the_original_and_bf16_when_pinned_to_float32():
    tgn = _torch_groupnorm(2, 8, seed=1)
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 4, 4, 8)) * 2
    layer = _nnx_copy(tgn)
    lp = LPGroupNorm.from_group_norm(layer)
    np.testing.assert_array_equal(np.asarray(_call(lp, x)), np.asarray(_call(layer, x)))
    np.testing.assert_array_equal(np.asarray(lp(x)), np.asarray(_call(lp, x)))  # jit equals eager

    def loss(layer, x):
        return (layer(x) ** 2).sum()

    g0, g1 = (jax.jit(jax.grad(loss, argnums=(0, 1)))(m, x) for m in (layer, lp))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    pinned = _nnx_copy(tgn, dtype=jnp.float32)  # float32 in a bf16 network; the replacement gives bf16
    assert _call(pinned, x.astype(BF16), BF16).dtype == jnp.float32
    assert _call(LPGroupNorm.from_group_norm(pinned), x.astype(BF16), BF16).dtype == BF16


class _GroupNormCNN(nnx.Module):
    """NHWC conv -> GroupNorm -> relu, twice, then a linear head."""

    def __init__(self, rngs: nnx.Rngs):
        self.conv1 = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.gn1 = nnx.GroupNorm(8, 4, epsilon=1e-5, rngs=rngs)
        self.conv2 = nnx.Conv(8, 8, (3, 3), strides=(2, 2), rngs=rngs)
        self.gn2 = nnx.GroupNorm(8, 2, epsilon=1e-5, rngs=rngs)
        self.head = nnx.Linear(8, 10, rngs=rngs)

    def __call__(self, x, *, train: bool, key=None):
        x = jax.nn.relu(self.gn1(self.conv1(x)))
        x = jax.nn.relu(self.gn2(self.conv2(x)))
        return self.head(x.mean((1, 2))).astype(jnp.float32)


class _TorchGroupNormCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(),
                                  nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.GroupNorm(2, 8), nn.ReLU())
        self.head = nn.Linear(8, 10)

    def forward(self, x):  # NHWC in, as the digits loader gives
        return self.head(self.body(x.permute(0, 3, 1, 2)).mean((2, 3)))


def test_surgery_counts_in_place_and_original_untouched():
    model = _GroupNormCNN(nnx.Rngs(0))
    new = apply_low_precision_groupnorm(model, "amp_bf16")
    assert isinstance(new.gn1, LPGroupNorm) and isinstance(new.gn2, LPGroupNorm) and new.gn2.num_groups == 2
    assert type(model.gn1) is nnx.GroupNorm and type(model.gn2) is nnx.GroupNorm
    paths = lambda m: sorted(jax.tree_util.keystr(p) for p, _ in
                             jax.tree_util.tree_flatten_with_path(nnx.state(m))[0])
    assert paths(new) == paths(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # converting again finds the converted layers: no warning
        assert apply_low_precision_groupnorm(new, "amp_bf16", inplace=True) is new

    tmodel = _TorchGroupNormCNN()
    before = {k: v.clone() for k, v in tmodel.state_dict().items()}
    x = torch.randn(2, 8, 8, 1)
    with torch.no_grad():
        y0 = tmodel(x)
    assert apply_low_precision_groupnorm(tmodel, "amp_bf16") is tmodel
    assert count_module_instances(tmodel, TorchLPGroupNorm) == 2 and tmodel.body[4].num_groups == 2
    assert all(torch.equal(before[k], v) for k, v in tmodel.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(tmodel(x), y0, rtol=0, atol=0)


def test_warnings_errors_and_method_in_place():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = _GroupNormCNN(nnx.Rngs(0))
    with pytest.warns(NoEffectWarning, match="only applies to AMP_FP16 and AMP_BF16"):
        assert apply_low_precision_groupnorm(model) is model
    with pytest.warns(NoEffectWarning, match="No instances of GroupNorm"):
        apply_low_precision_groupnorm(ResNetCIFAR(depth=8, width=4, rngs=nnx.Rngs(0)), "amp_bf16")
    with pytest.raises(TypeError, match="flax.nnx.Module or a torch.nn.Module"):
        apply_low_precision_groupnorm(object(), "amp_fp16")
    with pytest.raises(ValueError, match="only supports application on Event.INIT"):
        LowPrecisionGroupNorm(apply_at="batch_end")
    method = LowPrecisionGroupNorm(apply_at="after_load")
    assert method.order == 0  # Composer's engine only moves LowPrecisionLayerNorm last
    task = method.model(ComposerClassifier(model, num_classes=10), StepCtx(step=0, run=RunInfo(2)))
    assert task.source is model and isinstance(model.gn1, LPGroupNorm)


def _fit(task):
    from jaxcomposer import Trainer
    from jaxcomposer.data import ArrayLoader
    from jaxcomposer.loggers import InMemoryLogger
    from jaxcomposer.optim import DecoupledSGDW
    from tests.trainer.helpers import digits

    logger = InMemoryLogger()
    trainer = Trainer(model=task, train_dataloader=ArrayLoader(digits("train", n=64), 32, seed=0),
                      max_duration="2ba", optimizers=DecoupledSGDW(lr=0.05, momentum=0.9),
                      algorithms=[LowPrecisionGroupNorm()], seed=0, progress_bar=False, precision="amp_bf16",
                      devices=jax.devices()[:1], loggers=[logger])
    trainer.fit()
    losses = [v for _, v in logger.data["loss/train/total"]]
    assert len(losses) == 2 and np.all(np.isfinite(losses)) and losses[0] != losses[1]
    return trainer


def test_trains_native_cnn_in_amp_bf16():
    from jaxcomposer.models.tasks import ComposerClassifier
    model = _GroupNormCNN(nnx.Rngs(0))
    trainer = _fit(ComposerClassifier(model, num_classes=10))
    assert trainer.state.model is model and isinstance(model.gn2, LPGroupNorm)


def test_trains_bridged_torch_cnn_in_amp_bf16():
    from jaxcomposer.models.tasks import ComposerClassifier
    torch.manual_seed(0)
    module = _TorchGroupNormCNN()
    trainer = _fit(ComposerClassifier(module, num_classes=10))
    assert trainer.state.model.module is module and isinstance(module.body[1], TorchLPGroupNorm)
    np.testing.assert_array_equal(module.body[1].weight.detach().numpy(),
                                  trainer.state.train_state.params["body.1.weight"])
