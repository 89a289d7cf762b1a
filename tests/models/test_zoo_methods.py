"""The model-rewriting methods Composer applies to its ResNet recipes (BlurPool, SqueezeExcite, StochasticDepth), on
the native ImageNet ResNets and, through the same functional calls, on the torchvision ResNet (Composer's own
target): the same layers are replaced and the parameter counts agree. One table drives every case."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from jaxcomposer import functional as cf
from jaxcomposer import models
from jaxcomposer.algorithms.blurpool import BlurConv, BlurMaxPool2d, blur_2d
from jaxcomposer.algorithms.squeeze_excite import SqueezeExciteConv
from jaxcomposer.algorithms.stochastic_depth import StochasticBasicBlock, StochasticBottleneck
from tests.models import torchvision_resnet as tv

pytestmark = pytest.mark.xdist_group("test_zoo_methods")

# (depth, small shared kwargs); width 16 so BlurPool's min_channels=16 and SE's min_channels=64 select layers
NETS = {"resnet18": (18, dict(layers=(1, 1, 1, 1), width=16, num_classes=5)),
        "resnet50": (50, dict(layers=(1, 1, 1, 1), width=16, num_classes=5))}

def _named(*names):
    return lambda m: type(m).__name__ in names


def _stochastic(m) -> bool:  # Composer's torch surgery keeps the block's class and gives it a drop_rate
    return hasattr(m, "drop_rate") and type(m).__name__ in ("BasicBlock", "Bottleneck")


# method -> (functional call, NNX layer types it adds, which torch modules it made, expected counts per net);
# counts by hand: BlurPool = the stem max-pool + 3 stride-2 convs with >= 16 inputs + 3 strided projections;
# SE = the convs with min(in, out) >= 64
METHODS = {
    "blurpool": (lambda m: cf.apply_blurpool(m), (BlurMaxPool2d, BlurConv), _named("BlurMaxPool2d", "BlurConv2d"),
                 {"resnet18": 7, "resnet50": 7}),
    "squeeze_excite": (lambda m: cf.apply_squeeze_excite(m, latent_channels=16, min_channels=64),
                       (SqueezeExciteConv,), _named("SqueezeExciteConv2d"), {"resnet18": 4, "resnet50": 9}),
    "stochastic_depth_basic": (lambda m: cf.apply_stochastic_depth(m, "ResNetBasicBlock", drop_rate=0.2),
                               (StochasticBasicBlock,), _stochastic, {"resnet18": 4}),
    "stochastic_depth_bottleneck": (lambda m: cf.apply_stochastic_depth(m, "ResNetBottleneck", drop_rate=0.2),
                                    (StochasticBottleneck,), _stochastic, {"resnet50": 4}),
}
CASES = [(net, method) for method, spec in METHODS.items() for net in spec[3]]


def _nnx_net(net: str) -> nnx.Module:
    depth, kw = NETS[net]
    return models.resnet(depth, **kw)


def _torch_net(net: str) -> torch.nn.Module:
    depth, kw = NETS[net]
    return tv.resnet(depth, **{**kw, "layers": list(kw["layers"])})


def _torch_params(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("net,method", CASES)
def test_method_rewrites_native_and_torchvision_alike(net, method):
    apply, nnx_types, made_by_torch_surgery, counts = METHODS[method]
    ours, theirs = _nnx_net(net), _torch_net(net)
    assert models.num_params(ours) == _torch_params(theirs)  # the same network before surgery
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NoEffectWarning would mean nothing matched
        new_ours = apply(ours)
        new_theirs = apply(theirs)
    n_ours = sum(isinstance(m, nnx_types) for _, m in nnx.iter_graph(new_ours))
    n_theirs = sum(made_by_torch_surgery(m) for m in new_theirs.modules())
    assert n_ours == n_theirs == counts[net]
    assert models.num_params(new_ours) == _torch_params(new_theirs)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 32, 32, 3)), jnp.float32)
    logits = jax.jit(lambda m, x: m(x, train=False))(new_ours, x)
    assert logits.shape == (2, 5) and bool(jnp.isfinite(logits).all())


def test_blurred_maxpool_is_max_then_blur():
    net = _nnx_net("resnet18")
    pool = cf.apply_blurpool(net).maxpool
    assert isinstance(pool, BlurMaxPool2d)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(1, 8, 8, 2)), jnp.float32)
    stride1 = nnx.max_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)))
    np.testing.assert_allclose(np.asarray(pool(x)), np.asarray(blur_2d(stride1, 2)), rtol=0, atol=0)
    assert pool(x).shape == net.maxpool(x).shape == (1, 4, 4, 2)
