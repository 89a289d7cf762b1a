"""SqueezeExcite.

Method card
-----------
**What it does.** Puts a Squeeze-and-Excitation block after every 2-D convolution with
``min(in_channels, out_channels) >= min_channels``: the conv's output is average-pooled over space, fed through a
two-layer MLP without biases (``C -> latent -> C``, ReLU between, sigmoid after), and the result scales each output
channel of the conv. Each replaced conv becomes a :class:`SqueezeExciteConv` (``conv`` then ``se``), keeping the
conv's kernel and bias values; the MLP is new and trainable.

**When it helps.** CNNs for image classification (ResNets: Composer reports about +0.5-1% ImageNet top-1 for
ResNet-50 at ~20% more time per step, worth it on the larger ResNets). The extra cost is small when SE blocks sit
deep in the network, where feature maps are small: ``min_channels`` keeps them there. It changes nothing in
models without 2-D convolutions (MLPs, transformers): then it warns.

**Hyperparameters.** ``latent_channels`` (default ``64``: the MLP's hidden width; a value below 1 is a fraction
of the conv's out channels, ``int(latent_channels * out_channels)``), ``min_channels`` (default ``128``).

**Exact Composer semantics.** As ``composer/algorithms/squeeze_excite``: every ``Conv2d`` (any stride or kernel,
1x1 projections included) with ``min(in, out) >= min_channels`` is wrapped; the hidden width is
``int(latent_channels if latent_channels >= 1 else latent_channels * out_channels)``; both linear layers have no
bias and torch's default ``nn.Linear`` initialization (uniform in ``±1/sqrt(fan_in)``); the block computes
``x * sigmoid(W2 relu(W1 mean_hw(x)))``. Two deliberate differences on NNX models: convs already inside a
``SqueezeExciteConv`` are skipped, so applying the method twice does not stack a second SE block on the same conv
(Composer's surgery would wrap the inner conv again); and a hidden width that rounds to 0 (``latent_channels <
1`` on a narrow conv) is an error rather than a zero-width layer. Composer's torch module classes
(``SqueezeExcite2d``, ``SqueezeExciteConv2d``) are in :mod:`torch_bridge.methods.squeeze_excite`.

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built).
A torch-sourced task is surgered on its ``nn.Module`` before the bridge exports it, by the surgery torch_bridge
registers under ``"SqueezeExcite"`` (:func:`jaxcomposer.core.adapters.surgery`), so this module never imports
torch. A Flax NNX model has its ``nnx.Conv`` submodules (2-D, NHWC) swapped for :class:`SqueezeExciteConv`, in
place in the Trainer (the module the user passed is the trained one) and on a clone in :func:`apply_squeeze_excite`
unless ``inplace=True``. Replaced convs' parameter paths gain a ``conv`` segment (``blocks/1/conv1/conv/kernel``;
torch: ``layer.conv.weight``), so checkpoints of the surgered model need SqueezeExcite in the recipe (Composer's
``required_on_load``). The MLP's initial weights come from a fixed seed per conv (``nnx.Rngs(i)`` for the i-th
replaced conv), so the surgery is deterministic.

**Reference.** Hu, Shen, Albanie, Sun, Wu, "Squeeze-and-Excitation Networks", CVPR 2018 (arXiv:1709.01507).
Composer: ``composer/algorithms/squeeze_excite``.
"""
from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.algorithms.functional_io import optimizers_follow
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["SqueezeExcite", "SqueezeExcite2d", "SqueezeExciteConv", "apply_squeeze_excite", "latent_width"]

# torch's nn.Linear default: kaiming_uniform(a=sqrt(5)), i.e. uniform in +-1/sqrt(fan_in)
_torch_linear_init = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def latent_width(latent_channels: float, num_features: int) -> int:
    """Composer's hidden width: ``latent_channels`` itself, or a fraction of ``num_features`` when below 1."""
    return int(latent_channels if latent_channels >= 1 else latent_channels * num_features)


class SqueezeExcite2d(nnx.Module):
    """``x * sigmoid(fc2(relu(fc1(mean_hw(x)))))`` on NHWC ``x``; both linear layers without bias."""

    def __init__(self, num_features: int, latent_channels: float = 0.125, *, rngs: nnx.Rngs):
        self.latent_channels = latent_width(latent_channels, num_features)
        if self.latent_channels < 1:
            raise ValueError(f"SqueezeExcite: latent_channels={latent_channels} gives a hidden width of 0 for a "
                             f"layer with {num_features} channels; use latent_channels >= 1 or a larger fraction.")
        self.fc1 = nnx.Linear(num_features, self.latent_channels, use_bias=False, kernel_init=_torch_linear_init,
                              rngs=rngs)
        self.fc2 = nnx.Linear(self.latent_channels, num_features, use_bias=False, kernel_init=_torch_linear_init,
                              rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim != 4:
            raise ValueError(f"SqueezeExcite2d: expected NHWC (B, H, W, C), got shape {x.shape}")
        pooled = x.mean(axis=(1, 2))
        coeffs = jax.nn.sigmoid(self.fc2(jax.nn.relu(self.fc1(pooled))))
        return x * coeffs[:, None, None, :].astype(x.dtype)


class SqueezeExciteConv(nnx.Module):
    """An ``nnx.Conv`` (2-D, NHWC) followed by a :class:`SqueezeExcite2d` on its output: the NNX counterpart of
    Composer's ``SqueezeExciteConv2d``."""

    def __init__(self, conv: nnx.Conv, latent_channels: float = 0.125, *, rngs: nnx.Rngs):
        self.conv = conv
        self.se = SqueezeExcite2d(conv.out_features, latent_channels, rngs=rngs)

    def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
        return self.se(self.conv(x, *args, **kwargs))


def _is_eligible_conv(m: Any, min_channels: int) -> bool:
    return (isinstance(m, nnx.Conv) and len(tuple(m.kernel_size)) == 2
            and min(m.in_features, m.out_features) >= min_channels)


def _apply_nnx(model: nnx.Module, latent_channels: float, min_channels: int, optimizers: Any,
               inplace: bool) -> tuple[nnx.Module, int]:
    with optimizers_follow(model, optimizers, "apply_squeeze_excite"):  # (refuses an optimizer here)
        new = model if inplace else nnx.clone(model)
        # a shared conv gets one SE block everywhere; no second SE on a wrapped conv
        replace_modules(new, lambda m: _is_eligible_conv(m, min_channels),
                        lambda conv, i: SqueezeExciteConv(conv, latent_channels, rngs=nnx.Rngs(i)),
                        skip=(SqueezeExciteConv,))
    return new, sum(isinstance(m, SqueezeExciteConv) for _, m in nnx.iter_graph(new))


def apply_squeeze_excite(model: Any, latent_channels: float = 64, min_channels: int = 128, optimizers: Any = None,
                         *, inplace: bool | None = None):
    """Composer's ``apply_squeeze_excite(model, latent_channels=64, min_channels=128, optimizers=None)``; a torch
    optimizer given as ``optimizers`` holds the new layers' parameters afterwards, as in Composer.

    A torch module is edited in place and returned, as Composer does. A Flax NNX module is cloned and the new
    model returned unless ``inplace=True``. Warns with :class:`NoEffectWarning` when the result has no SE block.
    """
    new, count = apply_surgery(
        "SqueezeExcite", model, lambda m: _apply_nnx(m, latent_channels, int(min_channels), optimizers, bool(inplace)),
        who="apply_squeeze_excite", optimizers=optimizers, latent_channels=latent_channels,
        min_channels=int(min_channels))
    if count == 0:
        warnings.warn(NoEffectWarning(
            f"SqueezeExcite did not change any layers of {type(model).__name__}: no 2-D convolution with "
            f"min(in_channels, out_channels) >= {min_channels} was found."), stacklevel=2)
    return new


def SqueezeExcite(latent_channels: float = 64, min_channels: int = 128) -> Method:
    """Composer's ``SqueezeExcite(latent_channels=64, min_channels=128)`` as a :class:`Method` (``model`` slot)."""
    if not isinstance(latent_channels, (int, float)) or isinstance(latent_channels, bool) or latent_channels <= 0:
        raise ValueError(f"SqueezeExcite: latent_channels must be a positive number (a width, or a fraction of the "
                         f"out channels when below 1), got {latent_channels!r}.")
    if int(min_channels) != min_channels or min_channels < 0:
        raise ValueError(f"SqueezeExcite: min_channels must be a non-negative integer, got {min_channels!r}.")

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed becomes the trained one
        new = apply_squeeze_excite(task.source, latent_channels, int(min_channels), inplace=True)
        return task.with_model(new)

    return Method(name="SqueezeExcite", model=model_fn,
                  description=f"SqueezeExcite(latent_channels={latent_channels}, min_channels={min_channels})")


ENTRY = MethodEntry(registry_name="squeeze_excite", factory=SqueezeExcite, functional=(apply_squeeze_excite,))


_TORCH_LAYERS = ('SqueezeExciteConv2d',)  # Composer's torch layers of this method, handed out by the torch adapter


def __getattr__(name: str):
    if name in _TORCH_LAYERS:
        from jaxcomposer.core import adapters
        return adapters.framework_class("torch", name, wanted_by=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
