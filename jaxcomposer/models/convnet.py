"""A plain convolutional network: ``conv -> BatchNorm -> ReLU`` per stage, then a linear head on the flattened map.

The cheapest native image model to train on a CPU. Its default, three stride-2 3x3 convolutions of 32, 64 and 128
channels on 28x28 images (2.1M multiply-adds per image), does in three convolutions what ResNet-8 (width 16,
stride-2 stem; 2.5M) does in nine. Wide convolutions fill the CPU's vector units far better than narrow ones, and
each convolution has a fixed cost per call, so its CPU train step costs well under ResNet-8's, at a Fashion-MNIST
accuracy at least as high (benchmarks/README.md, "The Fashion-MNIST quickstart").

``head='flatten'`` (default) keeps where a feature is: centred, aligned images such as Fashion-MNIST's carry
class information in the layout (a sleeve's position), which a global average pool throws away. It fixes the
input size (``image_size``). ``head='avg'`` pools globally and takes any size, e.g. for progressive resizing.
Layouts are NHWC.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.models.dense import dense_dot_general
from jaxcomposer.models.resnet import batch_norm_layer, conv_layer, conv_function

HEADS = ("flatten", "avg")


def conv_output_size(size: int, kernel: int, stride: int) -> int:
    """Spatial size after a convolution padded by ``kernel // 2`` on each side (torch's ``padding=k//2``)."""
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


class ConvNet(nnx.Module):
    """``len(channels)`` stages of ``conv(kernel_size, stride) -> BatchNorm -> ReLU``, then a linear head.

    ``channels`` / ``strides``: one entry per stage. ``head``: ``'flatten'`` (the final map, flattened in H, W, C
    order) or ``'avg'`` (global average pool). ``image_size``: the square input size the flatten head is built
    for. ``conv_impl``: ``'auto'`` (default: per shape the faster of
    XLA's and oneDNN's convolutions, measured), ``'xla'`` or ``'onednn'``; see
    :func:`jaxcomposer.models.resnet.conv_function`. ``key`` is accepted for the shared model interface; the
    network draws no randomness.
    """

    def __init__(self, channels: Sequence[int] = (32, 64, 128), strides: Sequence[int] = (2, 2, 2),
                 kernel_size: int = 3, num_classes: int = 10, in_channels: int = 1, image_size: int = 28,
                 head: str = "flatten", bn_momentum: float = 0.9, conv_impl: str = "auto", *, rngs: nnx.Rngs):
        channels, strides = tuple(channels), tuple(strides)
        if not channels or any(not isinstance(c, int) or c < 1 for c in channels):
            raise ValueError(f"ConvNet: channels must be a non-empty list of positive ints, got {list(channels)}.")
        if len(strides) != len(channels) or any(not isinstance(s, int) or s < 1 for s in strides):
            raise ValueError(f"ConvNet: strides must give one positive int per stage ({len(channels)} stages: "
                             f"channels={list(channels)}), got strides={list(strides)}.")
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"ConvNet: kernel_size must be a positive odd int, got {kernel_size!r}.")
        if head not in HEADS:
            raise ValueError(f"ConvNet: head must be one of {HEADS}, got {head!r}.")
        size = image_size
        for s in strides:
            size = conv_output_size(size, kernel_size, s)
        if size < 1:
            raise ValueError(f"ConvNet: image_size={image_size} is too small for strides {list(strides)}.")
        conv_fn = conv_function(conv_impl, "ConvNet")
        self.head_kind, self.image_size, self.num_classes = head, image_size, num_classes
        cins = (in_channels, *channels[:-1])
        self.convs = nnx.List([conv_layer(a, b, kernel_size, s, rngs, conv_fn)
                               for a, b, s in zip(cins, channels, strides)])
        self.bns = nnx.List([batch_norm_layer(c, bn_momentum, rngs) for c in channels])
        features = channels[-1] * (size * size if head == "flatten" else 1)
        # dense_dot_general: the head's kernel gradient as an ordinary product on the CPU (models/dense.py says why)
        self.head = nnx.Linear(features, num_classes, dot_general=dense_dot_general, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4:
            raise ValueError(f"ConvNet: expected NHWC images (B, H, W, C), got shape {x.shape}.")
        if self.head_kind == "flatten" and x.shape[1:3] != (self.image_size, self.image_size):
            raise ValueError(f"ConvNet: head='flatten' was built for {self.image_size}x{self.image_size} images, "
                             f"got {x.shape[1]}x{x.shape[2]}; build it with image_size={x.shape[1]} or use "
                             f"head='avg' for inputs whose size changes (e.g. progressive resizing).")
        for conv, bn in zip(self.convs, self.bns):
            x = jax.nn.relu(bn(conv(x), use_running_average=not train))
        x = x.reshape(x.shape[0], -1) if self.head_kind == "flatten" else x.mean(axis=(1, 2))
        return self.head(x).astype(jnp.float32)
