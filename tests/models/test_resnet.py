"""CIFAR ResNet: shapes on the three image sizes we use, depth validation, exact param counts, BN state."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer.core.model import from_nnx
from jaxcomposer.models import ResNetCIFAR, num_params, resnet_cifar


def expected_params(depth, width, num_classes, in_channels, widen=(1, 2, 4)):
    """By hand: bias-free 3x3 convs, BN scale+bias (2c), 1x1 conv+BN projections when the shape changes."""
    n = (depth - 2) // 6
    conv = lambda cin, cout, k: k * k * cin * cout
    total = conv(in_channels, width, 3) + 2 * width
    cin = width
    for stage, mult in enumerate(widen):
        cout = width * mult
        for i in range(n):
            total += conv(cin, cout, 3) + conv(cout, cout, 3) + 4 * cout
            if cin != cout or (stage > 0 and i == 0):
                total += conv(cin, cout, 1) + 2 * cout
            cin = cout
    return total + cin * num_classes + num_classes


def test_resnet20_param_count():
    m = nnx.eval_shape(lambda: ResNetCIFAR(depth=20, width=16, num_classes=10, in_channels=3, rngs=nnx.Rngs(0)))
    assert expected_params(20, 16, 10, 3) == 272_474
    assert num_params(m) == 272_474


@pytest.mark.parametrize("depth,width,classes,cin", [(8, 8, 10, 1), (14, 4, 7, 3)])
def test_other_param_counts(depth, width, classes, cin):
    m = nnx.eval_shape(lambda: ResNetCIFAR(depth, width, classes, in_channels=cin, rngs=nnx.Rngs(0)))
    assert num_params(m) == expected_params(depth, width, classes, cin)


@pytest.mark.parametrize("shape,stem_stride", [((2, 28, 28, 1), 2), ((2, 8, 8, 1), 1), ((2, 32, 32, 3), 1)])
def test_output_shapes(key, shape, stem_stride):
    pure = from_nnx(resnet_cifar(8, 4, num_classes=10, in_channels=shape[-1], stem_stride=stem_stride))
    apply = jax.jit(pure.apply, static_argnames="train")
    for train in (True, False):
        out, _ = apply(pure.params, pure.state, jax.random.normal(key, shape), train=train)
        assert out.shape == (2, 10) and out.dtype == jnp.float32


@pytest.mark.parametrize("depth", [7, 10, 21, 0])
def test_depth_validation(depth):
    with pytest.raises(ValueError, match=rf"depth={depth}.*6n\+2.*8, 14, 20, 32, 44, 56, 110|6n\+2.*depth={depth}"):
        ResNetCIFAR(depth=depth, rngs=nnx.Rngs(0))


def test_batchnorm_state_changes_only_in_train(key):
    pure = from_nnx(ResNetCIFAR(8, 4, in_channels=1, rngs=nnx.Rngs(0)))
    x = 3.0 + jax.random.normal(key, (4, 8, 8, 1))
    # Snapshot first: in eager mode nnx.merge reuses the Variable objects, so apply can update pure.state in place.
    before = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(pure.state)]
    _, s_eval = pure.apply(pure.params, pure.state, x, train=False)
    after_eval = [np.array(leaf) for leaf in jax.tree_util.tree_leaves(s_eval)]
    _, s_train = pure.apply(pure.params, pure.state, x, train=True)
    after_train = jax.tree_util.tree_leaves(s_train)
    assert len(before) == 2 * 9  # stem + 3 blocks x 2 BN + 2 projections, each mean and var
    assert all(not np.allclose(a, b) for a, b in zip(before, after_train))
    assert all(np.array_equal(a, b) for a, b in zip(before, after_eval))


def test_running_mean_momentum(key):
    """Flax momentum 0.9 means running = 0.9 * running + 0.1 * batch (torch's momentum=0.1)."""
    m = ResNetCIFAR(8, 4, in_channels=1, rngs=nnx.Rngs(0))
    pure = from_nnx(m)
    x = 3.0 + jax.random.normal(key, (4, 8, 8, 1))
    _, s = pure.apply(pure.params, pure.state, x, train=True)
    batch_mean = m.stem_conv(x).mean(axis=(0, 1, 2))
    np.testing.assert_allclose(s["stem_bn"]["mean"][...], 0.1 * batch_mean, rtol=1e-4, atol=1e-6)


def test_init_kaiming_fan_out_and_zero_residual():
    m = ResNetCIFAR(8, 4, rngs=nnx.Rngs(0))
    w = m.blocks[-1].conv2.kernel[...]  # (3, 3, 16, 16), fan_out = 9 * 16
    assert abs(float(w.std()) / np.sqrt(2.0 / (9 * 16)) - 1.0) < 0.08
    assert float(jnp.abs(m.blocks[0].bn2.scale[...] - 1).max()) == 0.0
    z = ResNetCIFAR(8, 4, zero_init_residual=True, rngs=nnx.Rngs(0))
    assert all(float(jnp.abs(b.bn2.scale[...]).max()) == 0.0 for b in z.blocks)
    assert float(jnp.abs(z.blocks[0].bn1.scale[...] - 1).max()) == 0.0


def test_jit_equals_eager(key):
    pure = from_nnx(ResNetCIFAR(8, 4, in_channels=3, rngs=nnx.Rngs(0)))
    x = jax.random.normal(key, (3, 16, 16, 3))
    for train in (True, False):
        f = lambda p, s, x: pure.apply(p, s, x, train=train)
        (oj, sj), (oe, se) = jax.jit(f)(pure.params, pure.state, x), f(pure.params, pure.state, x)
        np.testing.assert_allclose(oj, oe, rtol=1e-4, atol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(sj), jax.tree_util.tree_leaves(se)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
