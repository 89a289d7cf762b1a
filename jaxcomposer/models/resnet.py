"""The CIFAR ResNet of He et al. (2016, §4.2): depth 6n+2, three stages of n basic blocks.

Unlike the ImageNet ResNets it has a 3x3 stem and no max-pool, so it works on small images (8x8 digits, 28x28
Fashion-MNIST, 32x32 CIFAR). Shape changes use 1x1 conv + BN projection shortcuts (option B) so every variant is
a plain stack of convolutions. Layouts are NHWC.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.core import adapters
from jaxcomposer.models.norms import with_cheap_stat_writes
from jaxcomposer.models._keys import split_dropout_keys

# torchvision's ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``: untruncated normal, variance 2 / fan_out.
kaiming_fan_out = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")

VALID_DEPTH_EXAMPLES = (8, 14, 20, 32, 44, 56, 110)


CONV_IMPLS = ("auto", "xla", "onednn")


def conv_function(conv_impl: str, where: str):
    """The ``lax.conv_general_dilated`` a model's convolutions call: XLA's own, oneDNN's on CPU, or per shape the
    faster of the two.

    ``'onednn'`` comes from the torch adapter (``torch_bridge.kernels``: ATen's oneDNN convolutions as XLA custom
    calls on CPU; XLA's on other platforms), loaded only when asked for. ``'auto'`` (the models' default) times both
    on each convolution shape the first time it is traced and keeps the faster, remembered on disk per machine
    (``torch_bridge.kernels.autotune``, where ``JAXCOMPOSER_CONV_AUTOTUNE=xla|onednn`` pins it); the Trainer says
    what it chose after its first step. It needs the torch adapter (so it imports torch when the model is built);
    without one, and off the CPU, it is XLA's.
    """
    if conv_impl == "xla":
        return jax.lax.conv_general_dilated
    if conv_impl == "auto":
        if not adapters.installed("torch"):
            return jax.lax.conv_general_dilated
        return adapters.kernel("torch", "conv_general_dilated_auto", wanted_by=f"{where}(conv_impl='auto')")
    if conv_impl == "onednn":
        return adapters.kernel("torch", "conv_general_dilated", wanted_by=f"{where}(conv_impl='onednn')")
    raise ValueError(f"{where}: conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}.")


def conv_layer(cin: int, cout: int, kernel: int, stride: int, rngs: nnx.Rngs,
          conv_fn=jax.lax.conv_general_dilated) -> nnx.Conv:
    # Explicit symmetric padding (torch's padding=k//2) rather than "SAME", which pads stride-2 convs asymmetrically.
    pad = kernel // 2
    return nnx.Conv(cin, cout, kernel_size=(kernel, kernel), strides=(stride, stride),
                    padding=((pad, pad), (pad, pad)), use_bias=False, kernel_init=kaiming_fan_out,
                    conv_general_dilated=conv_fn, rngs=rngs)


def batch_norm_layer(c: int, momentum: float, rngs: nnx.Rngs, zero: bool = False) -> nnx.BatchNorm:
    scale_init = jax.nn.initializers.zeros if zero else jax.nn.initializers.ones
    return with_cheap_stat_writes(nnx.BatchNorm(c, momentum=momentum, epsilon=1e-5, scale_init=scale_init,
                                                rngs=rngs))


_BLOCK_KEY_TAG = 0xB10C  # block keys fold this in first: never equal to dropout's split(key, 1)[0] == fold_in(key, 0)


def block_key(key: jax.Array | None, index: int, train: bool) -> jax.Array | None:
    """The key residual block ``index`` receives: independent of the dropout key, None in eval or without a key.

    Plain blocks ignore it (unused keys cost nothing under jit); StochasticDepth's blocks draw their drops from it,
    so they replay exactly from the step key the Trainer gives the model.
    """
    if not train or key is None:
        return None
    return jax.random.fold_in(jax.random.fold_in(key, _BLOCK_KEY_TAG), index)


class ResidualBlock(nnx.Module):
    """``relu(residual(x) + shortcut(x))``: the residual branch is the (conv, BN) pairs :meth:`branch` lists, with a
    relu between pairs; the shortcut is the identity, or a 1x1 conv + BN projection when the shape changes
    (:meth:`add_shortcut`). Subclasses build their layers and then call :meth:`add_shortcut`."""

    def add_shortcut(self, cin: int, cout: int, stride: int, bn_momentum: float, rngs: nnx.Rngs, conv_fn) -> None:
        if stride != 1 or cin != cout:
            self.proj_conv = conv_layer(cin, cout, 1, stride, rngs, conv_fn)
            self.proj_bn = batch_norm_layer(cout, bn_momentum, rngs)
        else:
            self.proj_conv = self.proj_bn = None

    def branch(self) -> list[tuple[nnx.Conv, nnx.BatchNorm]]:  # pragma: no cover - abstract
        raise NotImplementedError

    # The forward is split into its residual branch and its shortcut so that StochasticDepth's block subclass
    # (jaxcomposer/algorithms/stochastic_depth.py) can drop or scale the branch alone.
    def residual(self, x: jax.Array, *, train: bool) -> jax.Array:
        ura = not train
        *inner, (last_conv, last_bn) = self.branch()
        for conv, bn in inner:
            x = jax.nn.relu(bn(conv(x), use_running_average=ura))
        return last_bn(last_conv(x), use_running_average=ura)

    def shortcut(self, x: jax.Array, *, train: bool) -> jax.Array:
        return x if self.proj_conv is None else self.proj_bn(self.proj_conv(x), use_running_average=not train)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        del key  # a plain block is deterministic; the key is for stochastic subclasses (StochasticDepth)
        return jax.nn.relu(self.residual(x, train=train) + self.shortcut(x, train=train))


class BasicBlock(ResidualBlock):
    """``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))`` with a projection shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, bn_momentum: float, zero_init_residual: bool,
                 *, rngs: nnx.Rngs, conv_fn=jax.lax.conv_general_dilated):
        self.conv1 = conv_layer(cin, cout, 3, stride, rngs, conv_fn)
        self.bn1 = batch_norm_layer(cout, bn_momentum, rngs)
        self.conv2 = conv_layer(cout, cout, 3, 1, rngs, conv_fn)
        self.bn2 = batch_norm_layer(cout, bn_momentum, rngs, zero=zero_init_residual)
        self.add_shortcut(cin, cout, stride, bn_momentum, rngs, conv_fn)

    def branch(self) -> list[tuple[nnx.Conv, nnx.BatchNorm]]:
        return [(self.conv1, self.bn1), (self.conv2, self.bn2)]


class ResNetCIFAR(nnx.Module):
    """CIFAR-style ResNet; ``stem_stride=2`` makes a cheap variant (28x28 inputs give 14x14 feature maps).

    ``dropout`` drops pooled features before the head in training (timm's ``drop_rate``; 0, the paper's network,
    by default); ``key`` feeds it and may be None otherwise. ``conv_impl``: ``'auto'`` (default: per shape the faster
    of XLA's and oneDNN's convolutions, measured), ``'xla'`` or ``'onednn'`` (oneDNN's on CPU through the torch
    adapter; see :func:`conv_function`); parameters, state and checkpoints are the same either way.
    """

    def __init__(self, depth: int = 20, width: int = 16, num_classes: int = 10, in_channels: int = 3,
                 stem_stride: int = 1, widen: Sequence[int] = (1, 2, 4), bn_momentum: float = 0.9,
                 zero_init_residual: bool = False, dropout: float = 0.0, conv_impl: str = "auto", *,
                 rngs: nnx.Rngs):
        if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"ResNetCIFAR: depth must be 6n+2 with n >= 1, got depth={depth!r}; "
                             f"valid examples: {', '.join(map(str, VALID_DEPTH_EXAMPLES))}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"ResNetCIFAR: dropout must be in [0, 1), got {dropout}.")
        conv_fn = conv_function(conv_impl, "ResNetCIFAR")
        self.dropout_rate = dropout
        n = (depth - 2) // 6
        self.depth, self.num_classes = depth, num_classes
        self.stem_conv = conv_layer(in_channels, width, 3, stem_stride, rngs, conv_fn)
        self.stem_bn = batch_norm_layer(width, bn_momentum, rngs)
        blocks, cin = [], width
        for stage, mult in enumerate(widen):
            cout = width * mult
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                blocks.append(BasicBlock(cin, cout, stride, bn_momentum, zero_init_residual, rngs=rngs,
                                         conv_fn=conv_fn))
                cin = cout
        self.blocks = nnx.List(blocks)
        self.drop = nnx.Dropout(dropout)
        self.head = nnx.Linear(cin, num_classes, rngs=rngs)

    def __call__(self, x: jax.Array, *, train: bool, key: jax.Array | None = None) -> jax.Array:
        if x.ndim != 4:
            raise ValueError(f"ResNetCIFAR: expected NHWC images (B, H, W, C), got shape {x.shape}.")
        (drop_key,) = split_dropout_keys(key, 1, active=train and self.dropout_rate > 0, where="ResNetCIFAR")
        x = jax.nn.relu(self.stem_bn(self.stem_conv(x), use_running_average=not train))
        for i, block in enumerate(self.blocks):
            x = block(x, train=train, key=block_key(key, i, train))
        x = self.drop(x.mean(axis=(1, 2)), deterministic=not train, rngs=drop_key)
        return self.head(x).astype(jnp.float32)


def resnet_cifar(depth: int = 20, width: int = 16, num_classes: int = 10, *, rngs: nnx.Rngs | None = None,
                 seed: int = 0, **kwargs) -> ResNetCIFAR:
    """Convenience constructor: ``resnet_cifar(56, 16, in_channels=3)``; ``seed`` is used when ``rngs`` is None."""
    return ResNetCIFAR(depth, width, num_classes, rngs=rngs if rngs is not None else nnx.Rngs(seed), **kwargs)
