"""The ImageNet ResNets of He et al. (2016, §3.4) in torchvision's layout: ResNet-50 by default.

A 7x7 stride-2 stem and a 3x3 stride-2 max-pool take 224x224 images to 56x56, then four stages of bottleneck
blocks (1x1 reduce, 3x3, 1x1 expand by 4) at widths ``width * (1, 2, 4, 8)``, global average pooling and a linear
head. As in torchvision (the "v1.5" variant) a stage's stride sits on the 3x3 conv of its first block, and a block
whose shape changes gets a 1x1 conv + BN projection shortcut; convolutions have no bias and BN follows each one.
With the defaults the parameter count is torchvision's ``resnet50()``: 25,557,032. Layouts are NHWC.

``layers`` and ``width`` shrink it for tests (``layers=(1, 1, 1, 1), width=8`` runs on 32x32 images on a CPU, and
``layers=(1,)`` is one stage of one block).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys
# the same torchvision-style conv (kaiming fan-out) and BatchNorm, and the residual blocks' keys
from jaxcomposer.models.resnet import _bn, _conv, block_key

EXPANSION = 4  # a bottleneck's output has 4x the channels of its 3x3 conv


class Bottleneck(nnx.Module):
    """``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))``, stride on ``conv2`` (3x3)."""

    def __init__(self, cin: int, planes: int, stride: int, bn_momentum: float, zero_init_residual: bool,
                 *, rngs: nnx.Rngs):
        cout = planes * EXPANSION
        self.conv1 = _conv(cin, planes, 1, 1, rngs)
        self.bn1 = _bn(planes, bn_momentum, rngs)
        self.conv2 = _conv(planes, planes, 3, stride, rngs)
        self.bn2 = _bn(planes, bn_momentum, rngs)
        self.conv3 = _conv(planes, cout, 1, 1, rngs)
        # zero_init_residual starts every block as the identity (Goyal et al. 2017), as torchvision's flag does
        self.bn3 = _bn(cout, bn_momentum, rngs, zero=zero_init_residual)
        if stride != 1 or cin != cout:
            self.proj_conv = _conv(cin, cout, 1, stride, rngs)
            self.proj_bn = _bn(cout, bn_momentum, rngs)
        else:
            self.proj_conv = self.proj_bn = None

    # Residual branch and shortcut apart, as resnet.BasicBlock's, for StochasticDepth's block subclass.
    def residual(self, x: jax.Array, *, train: bool) -> jax.Array:
        ura = not train
        y = jax.nn.relu(self.bn1(self.conv1(x), use_running_average=ura))
        y = jax.nn.relu(self.bn2(self.conv2(y), use_running_average=ura))
        return self.bn3(self.conv3(y), use_running_average=ura)

    def shortcut(self, x: jax.Array, *, train: bool) -> jax.Array:
        return x if self.proj_conv is None else self.proj_bn(self.proj_conv(x), use_running_average=not train)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        del key  # a plain block is deterministic; the key is for stochastic subclasses (StochasticDepth)
        return jax.nn.relu(self.residual(x, train=train) + self.shortcut(x, train=train))


class ResNetImageNet(nnx.Module):
    """ImageNet-style bottleneck ResNet: ``layers`` blocks per stage (ResNet-50: (3, 4, 6, 3); ResNet-101:
    (3, 4, 23, 3); ResNet-152: (3, 8, 36, 3)). Stage ``i`` is ``width * 2**i`` wide; the ImageNet networks have
    four stages, and fewer make quick test networks (``layers=(1,)``: stem, one block, head).

    ``bn_momentum`` is flax's (weight of the old running average; torchvision's momentum 0.1 is 0.9 here).
    ``dropout`` drops pooled features before the head in training (0, torchvision's network, by default); ``key``
    feeds it and may be None otherwise.
    """

    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000,
                 in_channels: int = 3, bn_momentum: float = 0.9, zero_init_residual: bool = False,
                 dropout: float = 0.0, *, rngs: nnx.Rngs):
        layers = tuple(layers)
        if not layers or not all(isinstance(n, int) and n >= 1 for n in layers):
            raise ValueError(f"ResNetImageNet: layers must be block counts >= 1, one per stage, got {layers!r}; "
                             "ResNet-50 is (3, 4, 6, 3).")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"ResNetImageNet: dropout must be in [0, 1), got {dropout}.")
        self.layers, self.width, self.num_classes, self.dropout_rate = layers, width, num_classes, dropout
        self.stem_conv = _conv(in_channels, width, 7, 2, rngs)
        self.stem_bn = _bn(width, bn_momentum, rngs)
        blocks, cin = [], width
        for stage, n in enumerate(layers):
            planes = width * 2 ** stage
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(Bottleneck(cin, planes, stride, bn_momentum, zero_init_residual, rngs=rngs))
                cin = planes * EXPANSION
        self.blocks = nnx.List(blocks)
        self.drop = nnx.Dropout(dropout)
        self.head = nnx.Linear(cin, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4:
            raise ValueError(f"ResNetImageNet: expected NHWC images (B, H, W, C), got shape {x.shape}.")
        (drop_key,) = split_dropout_keys(key, 1, active=train and self.dropout_rate > 0, where="ResNetImageNet")
        x = jax.nn.relu(self.stem_bn(self.stem_conv(x), use_running_average=not train))
        # torch's MaxPool2d(3, 2, padding=1): reduce_window pads with -inf, so padding never wins the max
        x = nnx.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
        for i, block in enumerate(self.blocks):
            x = block(x, train=train, key=block_key(key, i, train))
        x = self.drop(x.mean(axis=(1, 2)), deterministic=not train, rngs=drop_key)
        return self.head(x).astype(jnp.float32)


def resnet50(num_classes: int = 1000, *, rngs: nnx.Rngs | None = None, seed: int = 0, **kwargs) -> ResNetImageNet:
    """torchvision's ``resnet50()`` in NNX (NHWC): ``resnet50()``, ``resnet50(10, width=8)``; ``seed`` is used
    when ``rngs`` is None; other keywords go to :class:`ResNetImageNet`."""
    return ResNetImageNet(**{"layers": (3, 4, 6, 3), **kwargs}, num_classes=num_classes,
                          rngs=rngs if rngs is not None else nnx.Rngs(seed))
