"""ConvNet: param counts, both heads, the flatten head's input-size check, argument validation, config name."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcomposer import config as config_lib
from jaxcomposer.core.model import from_nnx
from jaxcomposer.models import BUILDERS, ConvNet, num_params
from jaxcomposer.models.convnet import conv_output_size


def expected_params(channels, strides, kernel, classes, cin, size, head):
    """By hand: bias-free convs, BN scale+bias, a linear head on the flattened (or pooled) final map."""
    total, prev = 0, cin
    for c, s in zip(channels, strides):
        total += kernel * kernel * prev * c + 2 * c
        size, prev = (size + 2 * (kernel // 2) - kernel) // s + 1, c
    features = prev * (size * size if head == "flatten" else 1)
    return total + features * classes + classes


@pytest.mark.parametrize("kw", [dict(), dict(channels=(8, 16), strides=(1, 2), kernel_size=5, num_classes=7,
                                            in_channels=3, image_size=32, head="avg")])
def test_param_count(kw):
    m = nnx.eval_shape(lambda: ConvNet(**kw, rngs=nnx.Rngs(0)))
    full = dict(channels=(32, 64, 128), strides=(2, 2, 2), kernel_size=3, num_classes=10, in_channels=1,
                image_size=28, head="flatten") | kw
    assert num_params(m) == expected_params(full["channels"], full["strides"], full["kernel_size"],
                                            full["num_classes"], full["in_channels"], full["image_size"], full["head"])
    if not kw:  # the default: 28 -> 14 -> 7 -> 4, a 4x4x128 map into the head
        assert m.head.in_features == 4 * 4 * 128 and num_params(m) == 113_386


def test_output_size_matches_the_convolution(key):
    for size, k, s in [(28, 3, 2), (7, 3, 2), (8, 5, 1), (9, 3, 3), (1, 3, 2)]:
        y = jax.lax.conv_general_dilated(jnp.zeros((1, size, size, 1)), jnp.zeros((k, k, 1, 1)), (s, s),
                                         [(k // 2, k // 2)] * 2, dimension_numbers=("NHWC", "HWIO", "NHWC"))
        assert y.shape[1] == conv_output_size(size, k, s)


@pytest.mark.parametrize("head,shape", [("flatten", (3, 12, 12, 2)), ("avg", (3, 12, 12, 2)), ("avg", (3, 20, 9, 2))])
def test_outputs_and_batchnorm_state(key, head, shape):
    pure = from_nnx(ConvNet((4, 8), (2, 2), in_channels=2, image_size=12, head=head, num_classes=5,
                            rngs=nnx.Rngs(0)))
    x = 2.0 + jax.random.normal(key, shape)
    out_eval, s_eval = pure.apply(pure.params, pure.state, x, train=False)
    out_train, s_train = pure.apply(pure.params, pure.state, x, train=True)
    assert out_eval.shape == out_train.shape == (3, 5) and out_eval.dtype == jnp.float32
    assert not np.allclose(out_eval, out_train)  # batch statistics in training, running ones in eval
    before, after = jax.tree_util.tree_leaves(pure.state), jax.tree_util.tree_leaves(s_train)
    assert len(before) == 4 and all(not np.allclose(a, b) for a, b in zip(before, after))
    assert all(np.array_equal(a, b) for a, b in zip(before, jax.tree_util.tree_leaves(s_eval)))


def test_flatten_head_keeps_position(key):
    """Unlike a global pool, the flatten head tells a feature in one corner from the same feature in another."""
    m = ConvNet((4,), (1,), in_channels=1, image_size=6, rngs=nnx.Rngs(0))
    x = jnp.zeros((1, 6, 6, 1))
    a = m(x.at[0, 0, 0, 0].set(5.0), train=False)
    b = m(x.at[0, 5, 5, 0].set(5.0), train=False)
    assert not np.allclose(a, b)
    pooled = ConvNet((4,), (1,), in_channels=1, image_size=6, head="avg", rngs=nnx.Rngs(0))
    # a pool sees the same multiset of responses away from the borders: interior positions give equal logits
    np.testing.assert_allclose(pooled(x.at[0, 2, 2, 0].set(5.0), train=False),
                               pooled(x.at[0, 3, 3, 0].set(5.0), train=False), rtol=1e-6)


def test_flatten_head_rejects_other_sizes():
    m = ConvNet((4,), (2,), in_channels=1, image_size=28, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"built for 28x28 images, got 14x14.*image_size=14.*head='avg'"):
        m(jnp.zeros((2, 14, 14, 1)), train=False)
    with pytest.raises(ValueError, match=r"NHWC"):
        m(jnp.zeros((2, 28, 28)), train=False)


@pytest.mark.parametrize("kw,match", [
    (dict(channels=()), r"channels must be a non-empty list of positive ints, got \[\]"),
    (dict(channels=(8, 0), strides=(2, 2)), r"channels .* got \[8, 0\]"),
    (dict(channels=(8, 16), strides=(2,)), r"strides must give one positive int per stage \(2 stages"),
    (dict(kernel_size=4), r"kernel_size must be a positive odd int, got 4"),
    (dict(head="max"), r"head must be one of \('flatten', 'avg'\), got 'max'"),
    (dict(channels=(8,), strides=(2,), image_size=0), r"image_size=0 is too small"),
    (dict(conv_impl="cudnn"), r"conv_impl must be one of"),
])
def test_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        ConvNet(**kw, rngs=nnx.Rngs(0))


def test_config_name():
    assert BUILDERS["convnet"] is ConvNet
    cfg = config_lib.load_config({"model": {"name": "convnet", "channels": [8, 16], "strides": [2, 2]},
                                  "data": {"name": "fashion_mnist"}, "max_duration": "1ep"})
    assert cfg.model == {"name": "convnet", "channels": [8, 16], "strides": [2, 2]}
    with pytest.raises(Exception, match=r"model\.chanels.*channels"):
        config_lib.load_config({"model": {"name": "convnet", "chanels": [8]}, "data": {"name": "fashion_mnist"}, "max_duration": "1ep"})
