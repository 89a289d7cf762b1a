"""The ImageNet ResNets of He et al. (2016, §3.4) in torchvision's layout: ResNet-18/34/50/101/152.

A 7x7 stride-2 stem and a 3x3 stride-2 max-pool take 224x224 images to 56x56, then four stages of residual blocks
at widths ``width * (1, 2, 4, 8)``, global average pooling and a linear head. ResNet-18 and -34 use basic blocks
(two 3x3 convs); ResNet-50, -101 and -152 use bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4). As in
torchvision (the "v1.5" variant) a stage's stride sits on the first 3x3 conv of its first block, and a block whose
shape changes gets a 1x1 conv + BN projection shortcut; convolutions have no bias and BN follows each one.
Parameter counts equal torchvision's (``DEPTHS`` lists them; ResNet-50: 25,557,032). Layouts are NHWC;
``torch_bridge.weights`` converts torchvision ``state_dict``s both ways.

``layers`` and ``width`` shrink a network for tests (``layers=(1, 1, 1, 1), width=8`` runs on 32x32 images on a
CPU, and ``layers=(1,)`` is one stage of one block).
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models._keys import split_dropout_keys
# the same torchvision-style conv (kaiming fan-out) and BatchNorm, and the residual blocks' keys
from jaxcomposer.models.pooling import max_pool
from jaxcomposer.models.resnet import (BasicBlock, ResidualBlock, batch_norm_layer, block_key, conv_function,
                                      conv_layer)

EXPANSION = 4  # a bottleneck's output has 4x the channels of its 3x3 conv
BLOCKS = ("basic", "bottleneck")

# depth -> (block, blocks per stage, torchvision's parameter count with 1000 classes)
DEPTHS: dict[int, tuple[str, tuple[int, ...], int]] = {
    18: ("basic", (2, 2, 2, 2), 11_689_512),
    34: ("basic", (3, 4, 6, 3), 21_797_672),
    50: ("bottleneck", (3, 4, 6, 3), 25_557_032),
    101: ("bottleneck", (3, 4, 23, 3), 44_549_160),
    152: ("bottleneck", (3, 8, 36, 3), 60_192_808),
}


class MaxPool2d(nnx.Module):
    """torch's ``nn.MaxPool2d(kernel, stride, padding)`` on NHWC, as a module so that surgery can find it (BlurPool
    swaps it for a blurred max-pool, as Composer does to torchvision's ``maxpool``). No parameters or state.

    Padding never wins the max, as in torch; the gradient goes to each window's first maximum, as torch's does,
    through :func:`jaxcomposer.models.pooling.max_pool` (no scatter).
    """

    def __init__(self, kernel_size: int = 3, stride: int = 2, padding: int = 1):
        self.kernel_size, self.stride, self.padding = int(kernel_size), int(stride), int(padding)

    def __call__(self, x: jax.Array, stride: int | None = None) -> jax.Array:
        s, p, k = self.stride if stride is None else stride, self.padding, self.kernel_size
        return max_pool(x, (1, k, k, 1), (1, s, s, 1), ((0, 0), (p, p), (p, p), (0, 0)))


class Bottleneck(ResidualBlock):
    """``relu(bn3(conv3(relu(bn2(conv2(relu(bn1(conv1(x)))))))) + shortcut(x))``, stride on ``conv2`` (3x3)."""

    def __init__(self, cin: int, planes: int, stride: int, bn_momentum: float, zero_init_residual: bool,
                 *, rngs: nnx.Rngs, conv_fn=jax.lax.conv_general_dilated):
        cout = planes * EXPANSION
        self.conv1 = conv_layer(cin, planes, 1, 1, rngs, conv_fn)
        self.bn1 = batch_norm_layer(planes, bn_momentum, rngs)
        self.conv2 = conv_layer(planes, planes, 3, stride, rngs, conv_fn)
        self.bn2 = batch_norm_layer(planes, bn_momentum, rngs)
        self.conv3 = conv_layer(planes, cout, 1, 1, rngs, conv_fn)
        # zero_init_residual starts every block as the identity (Goyal et al. 2017), as torchvision's flag does
        self.bn3 = batch_norm_layer(cout, bn_momentum, rngs, zero=zero_init_residual)
        self.add_shortcut(cin, cout, stride, bn_momentum, rngs, conv_fn)

    def branch(self) -> list[tuple[nnx.Conv, nnx.BatchNorm]]:
        return [(self.conv1, self.bn1), (self.conv2, self.bn2), (self.conv3, self.bn3)]


class ResNetImageNet(nnx.Module):
    """ImageNet-style ResNet: ``layers`` blocks per stage of kind ``block`` (``'basic'`` or ``'bottleneck'``;
    :data:`DEPTHS` gives the published networks). Stage ``i`` is ``width * 2**i`` wide; the ImageNet networks have
    four stages, and fewer make quick test networks (``layers=(1,)``: stem, one block, head).

    ``bn_momentum`` is flax's (weight of the old running average; torchvision's momentum 0.1 is 0.9 here).
    ``dropout`` drops pooled features before the head in training (0, torchvision's network, by default); ``key``
    feeds it and may be None otherwise. ``conv_impl``: ``'auto'`` (default), ``'xla'`` or ``'onednn'``, as in
    ``ResNetCIFAR``. ``blocks`` is one flat list over the stages; ``stage_of_block`` names each block's
    (stage, index), torchvision's ``layer{stage + 1}.{index}``.
    """

    # logical axes of each parameter (jaxcomposer.models.sharding): conv kernels are HWIO
    PARTITION_RULES = (
        (r".*conv\d?/kernel", (None, None, "conv_in", "conv_out")),
        (r".*(bn\d?)/(scale|bias|mean|var)", ("conv_out",)),
        (r"head/kernel", ("conv_out", "classes")),
        (r"head/bias", ("classes",)),
    )

    def __init__(self, layers: Sequence[int] = (3, 4, 6, 3), width: int = 64, num_classes: int = 1000,
                 in_channels: int = 3, block: str = "bottleneck", bn_momentum: float = 0.9,
                 zero_init_residual: bool = False, dropout: float = 0.0, conv_impl: str = "auto", *,
                 rngs: nnx.Rngs):
        layers = tuple(layers)
        if not layers or not all(isinstance(n, int) and n >= 1 for n in layers):
            raise ValueError(f"ResNetImageNet: layers must be block counts >= 1, one per stage, got {layers!r}; "
                             "ResNet-50 is (3, 4, 6, 3).")
        if block not in BLOCKS:
            raise ValueError(f"ResNetImageNet: block must be one of {BLOCKS}, got {block!r}; ResNet-18/34 use "
                             "'basic', ResNet-50/101/152 'bottleneck'.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"ResNetImageNet: dropout must be in [0, 1), got {dropout}.")
        conv_fn = conv_function(conv_impl, "ResNetImageNet")
        self.layers, self.width, self.num_classes, self.dropout_rate = layers, width, num_classes, dropout
        self.block_kind = block
        self.stem_conv = conv_layer(in_channels, width, 7, 2, rngs, conv_fn)
        self.stem_bn = batch_norm_layer(width, bn_momentum, rngs)
        self.maxpool = MaxPool2d(3, 2, 1)
        blocks, cin, self.stage_of_block = [], width, []
        for stage, n in enumerate(layers):
            planes = width * 2 ** stage
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                if block == "basic":
                    blocks.append(BasicBlock(cin, planes, stride, bn_momentum, zero_init_residual, rngs=rngs,
                                             conv_fn=conv_fn))
                    cin = planes
                else:
                    blocks.append(Bottleneck(cin, planes, stride, bn_momentum, zero_init_residual, rngs=rngs,
                                             conv_fn=conv_fn))
                    cin = planes * EXPANSION
                self.stage_of_block.append((stage, i))
        self.blocks = nnx.List(blocks)
        self.drop = nnx.Dropout(dropout)
        self.head = nnx.Linear(cin, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4:
            raise ValueError(f"ResNetImageNet: expected NHWC images (B, H, W, C), got shape {x.shape}.")
        (drop_key,) = split_dropout_keys(key, 1, active=train and self.dropout_rate > 0, where="ResNetImageNet")
        x = jax.nn.relu(self.stem_bn(self.stem_conv(x), use_running_average=not train))
        x = self.maxpool(x)
        for i, block in enumerate(self.blocks):
            x = block(x, train=train, key=block_key(key, i, train))
        x = self.drop(x.mean(axis=(1, 2)), deterministic=not train, rngs=drop_key)
        return self.head(x).astype(jnp.float32)


def resnet(depth: int = 50, num_classes: int = 1000, *, rngs: nnx.Rngs | None = None, seed: int = 0,
           **kwargs) -> ResNetImageNet:
    """torchvision's ``resnet{depth}()`` in NNX (NHWC): ``resnet(18)``, ``resnet(50, 10, width=8)``. ``seed`` is
    used when ``rngs`` is None; other keywords go to :class:`ResNetImageNet` (``layers`` overrides the depth's
    block counts, for small test networks of the same kind)."""
    if depth not in DEPTHS:
        raise ValueError(f"resnet: depth must be one of {sorted(DEPTHS)} (torchvision's ImageNet ResNets), got "
                         f"{depth!r}; for other block counts build ResNetImageNet(layers=..., block=...).")
    block, layers, _ = DEPTHS[depth]
    return ResNetImageNet(**{"layers": layers, "block": block, **kwargs}, num_classes=num_classes,
                          rngs=rngs if rngs is not None else nnx.Rngs(seed))


def resnet18(num_classes: int = 1000, **kwargs) -> ResNetImageNet:
    return resnet(18, num_classes, **kwargs)


def resnet34(num_classes: int = 1000, **kwargs) -> ResNetImageNet:
    return resnet(34, num_classes, **kwargs)


def resnet50(num_classes: int = 1000, **kwargs) -> ResNetImageNet:
    """torchvision's ``resnet50()``: ``resnet50()``, ``resnet50(10, width=8)`` (see :func:`resnet`)."""
    return resnet(50, num_classes, **kwargs)


def resnet101(num_classes: int = 1000, **kwargs) -> ResNetImageNet:
    return resnet(101, num_classes, **kwargs)


def resnet152(num_classes: int = 1000, **kwargs) -> ResNetImageNet:
    return resnet(152, num_classes, **kwargs)
