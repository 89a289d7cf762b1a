"""ImageNet ResNet (torchvision layout): ResNet-50's exact parameter count, feature-map sizes, a tiny train step.

Everything that executes uses a tiny network (width 8, two stages of one block: a stride-1 and a stride-2
projection block, 32x32 images); ResNet-50 itself is only built abstractly (``nnx.eval_shape``), so the file runs
in a few seconds.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.core.model import from_nnx
from jaxcomposer.models import ResNetImageNet, num_params, resnet50

TORCHVISION_RESNET50_PARAMS = 25_557_032  # sum(p.numel() for p in torchvision.models.resnet50().parameters())
TINY = dict(layers=(1, 1), width=8, num_classes=10)


def expected_params(layers, width, num_classes, in_channels=3):
    """By hand: bias-free convs, BN scale+bias (2c), 1x1 conv+BN projections where the shape changes, fc + bias."""
    conv = lambda cin, cout, k: k * k * cin * cout
    total, cin = conv(in_channels, width, 7) + 2 * width, width
    for stage, n in enumerate(layers):
        planes = width * 2 ** stage
        for i in range(n):
            total += conv(cin, planes, 1) + conv(planes, planes, 3) + conv(planes, 4 * planes, 1) + 2 * 6 * planes
            if i == 0:  # every stage's first block changes the shape (stage 1: the channel count only)
                total += conv(cin, 4 * planes, 1) + 2 * 4 * planes
            cin = 4 * planes
    return total + cin * num_classes + num_classes


def test_resnet50_param_count_is_torchvisions():
    m = nnx.eval_shape(lambda: resnet50())
    assert expected_params((3, 4, 6, 3), 64, 1000) == TORCHVISION_RESNET50_PARAMS
    assert num_params(m) == TORCHVISION_RESNET50_PARAMS
    assert len(m.blocks) == 16 and m.head.in_features == 2048


def test_resnet50_feature_map_sizes():
    """224 px: stem + max-pool -> 56, stages -> 56, 28, 14, 7 (stride on the 3x3 of each stage's first block)."""
    graphdef, state = nnx.split(nnx.eval_shape(lambda: resnet50()))
    x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)

    def features(state, x):
        m = nnx.merge(graphdef, state)
        sizes = [nnx.max_pool(m.stem_conv(x), (3, 3), (2, 2), ((1, 1), (1, 1)))]
        for block in m.blocks:
            sizes.append(block(sizes[-1], train=False))
        return sizes, m.head(sizes[-1].mean(axis=(1, 2)))

    maps, logits = jax.eval_shape(features, state, x)
    firsts = np.cumsum((0, 3, 4, 6))  # index of each stage's first block; +1: maps[0] is the stem's output
    assert maps[0].shape == (1, 56, 56, 64)
    assert [maps[int(i) + 1].shape for i in firsts] == [(1, 56, 56, 256), (1, 28, 28, 512), (1, 14, 14, 1024),
                                                       (1, 7, 7, 2048)]
    assert logits.shape == (1, 1000)


@pytest.mark.parametrize("layers,width,classes,cin",
                         [((1, 1, 1, 1), 8, 10, 3), ((2, 1, 1, 2), 4, 7, 1), ((1,), 8, 10, 3)])
def test_other_param_counts(layers, width, classes, cin):
    m = nnx.eval_shape(lambda: ResNetImageNet(layers, width, classes, in_channels=cin, rngs=nnx.Rngs(0)))
    assert num_params(m) == expected_params(layers, width, classes, cin)


def test_tiny_forward_and_bn_state(key):
    pure = from_nnx(nnx.jit(lambda: resnet50(**TINY))())  # one compile for all the initializers
    x = 2.0 + jax.random.normal(key, (2, 32, 32, 3))
    apply = jax.jit(pure.apply, static_argnames="train")
    before = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(pure.state)]
    out, s_train = apply(pure.params, pure.state, x, train=True)
    assert out.shape == (2, 10) and out.dtype == jnp.float32 and bool(jnp.isfinite(out).all())
    after = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(s_train)]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after))  # training moved the BN statistics


def test_validation():
    for layers in [(), (3, 0, 6, 3)]:
        with pytest.raises(ValueError, match="block counts >= 1"):
            ResNetImageNet(layers=layers, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="dropout"):
        ResNetImageNet(dropout=1.0, rngs=nnx.Rngs(0))
