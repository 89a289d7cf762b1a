"""BlurPool.

Method card
-----------
**What it does.** Adds an anti-aliasing blur (``[1,2,1] ⊗ [1,2,1] / 16``, depthwise) wherever a CNN subsamples.
Strided convolutions with ``in_channels >= min_channels`` become ``BlurConv`` (blur with stride 1, then the
original conv with its stride, or with ``blur_first=False`` the conv with stride 1, then blur with the conv's
stride), and max-pools become ``BlurMaxPool2d`` (max with stride 1, then blur + subsample with the pool's stride);
the blur zero-pads by one pixel ("same"). The conv keeps its kernel and bias values; the filter is a constant,
not a parameter, so the trainable parameter count is unchanged.

**When it helps.** Convolutional image classifiers (ResNets on ImageNet: Composer reports about +0.5% top-1, which
it counts as roughly a 1.2x speedup to the same accuracy) and more shift-invariant predictions. It costs extra
memory bandwidth (and, with ``blur_first=False``, up to ``stride**2`` times the FLOPs of each replaced conv). It is
a no-op on models without strided convs or max-pools (MLPs, transformers): then it warns, as Composer does.

**Hyperparameters.** ``replace_convs`` (default ``True``), ``replace_maxpools`` (default ``True``),
``blur_first`` (default ``True``), ``min_channels`` (default ``16``: convs with fewer input channels, typically
the stem, are left alone).

**Exact Composer semantics.** As ``composer/algorithms/blurpool``: ``np.max(stride) > 1 and in_channels >=
min_channels`` selects convs (1x1 projection shortcuts with stride 2 included); every ``MaxPool2d`` is replaced;
``blur_2d`` zero-pads by ``k // 2`` (not reflect). One deliberate difference on NNX models: convs already inside a
``BlurConv`` are skipped, so applying BlurPool twice does not blur twice (Composer's torch surgery, kept as is in
:mod:`torch_bridge.surgery`, would wrap the inner strided conv again). The torch layers and Composer's
``replace_module_classes`` are in :mod:`torch_bridge.surgery`. As in Composer, the method edits the model in place
(torch and NNX alike), so the module the user passed is the trained one; the functional ``apply_blurpool`` edits a
torch module in place but returns a new NNX module unless ``inplace=True``. There is no optimizer to re-point:
``tx.init`` runs after the ``model`` slot.

**How it plugs in.** ``model`` slot, ``model(task, ctx) -> task`` (host, once, before the optimizer is built; it
reads nothing from the ctx; docs/design.md, "Methods and slots"). A torch-sourced task is surgered on its
``nn.Module`` *before* the bridge exports it, so the exported graph contains the blur; that surgery is the one
torch_bridge's adapter registers under the name ``"BlurPool"`` (:func:`jaxcomposer.core.adapters.surgery`), so this
module never imports torch. A Flax NNX model is cloned and its strided ``nnx.Conv`` submodules (2-D, NHWC) are
swapped for :class:`BlurConv`, and its max-pool modules (:class:`jaxcomposer.models.resnet_imagenet.MaxPool2d`,
the ImageNet ResNets' stem pool) for :class:`BlurMaxPool2d`; pooling written as a plain function call (as in the
CIFAR ResNet, which has none) is invisible to surgery. Parameter paths of replaced convs gain a ``conv`` segment
(``blocks/1/conv1/conv/kernel``; torch: ``layer.conv.weight``), so checkpoints of the surgered model need BlurPool
in the recipe (Composer's ``required_on_load``).

**Reference.** Zhang, "Making Convolutional Networks Shift-Invariant Again", ICML 2019 (arXiv:1904.11486).
Composer: ``composer/algorithms/blurpool``.
"""
from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxcomposer.algorithms.functional_io import optimizers_follow
from jaxcomposer.algorithms.nnx_surgery import apply_surgery, replace_modules
from jaxcomposer.core.method import Method, MethodEntry
from jaxcomposer.errors import NoEffectWarning
from jaxcomposer.models.resnet_imagenet import MaxPool2d

__all__ = ["BlurPool", "BlurConv", "BlurMaxPool2d", "apply_blurpool", "blur_2d"]


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = tuple(int(s) for s in v)
    return v * 2 if len(v) == 1 else v


def _blur_along(x: jax.Array, axis: int, stride: int) -> jax.Array:
    """``[1, 2, 1] / 4`` along one axis, zero padding of 1, then every ``stride``-th output."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (1, 1)
    xp = jnp.pad(x, pad)
    n_out = (x.shape[axis] - 1) // stride + 1  # a 3-tap, 1-padded conv's output size

    def tap(k: int) -> jax.Array:
        return jax.lax.slice_in_dim(xp, k, k + stride * (n_out - 1) + 1, stride, axis)

    return (tap(0) + 2 * tap(1) + tap(2)) * 0.25


def blur_2d(x: jax.Array, stride: int | tuple[int, int] = 1) -> jax.Array:
    """Depthwise ``[1,2,1]⊗[1,2,1]/16`` blur of an NHWC array, zero 'same' padding (1 px), then ``stride``.

    Composer's ``blur_2d`` in NHWC: ``F.conv2d(x, filt, stride, padding=1, groups=C)``. Computed as the separable
    filter it is, shifted adds along H then W (the weights are powers of two, so only the summation order differs
    from the convolution): XLA fuses them into one pass, where the grouped convolution is far slower on CPU
    (benchmarks/README.md, "Measurements behind code choices").
    """
    if x.ndim != 4:
        raise ValueError(f"blur_2d: expected NHWC (B, H, W, C), got shape {x.shape}")
    sh, sw = _pair(stride)
    return _blur_along(_blur_along(x, 1, sh), 2, sw)


class BlurConv(nnx.Module):
    """An ``nnx.Conv`` (2-D, NHWC) with an anti-aliasing blur: the NNX counterpart of torch's ``BlurConv2d``.

    ``blur_first=True``: ``conv(blur(x, stride=1))`` with the conv's own stride. ``blur_first=False``: the conv
    runs with stride 1 and ``blur(conv(x), stride=conv_stride)`` subsamples. The filter is rebuilt from constants
    in ``__call__``: it is neither a parameter nor state.
    """

    def __init__(self, conv: nnx.Conv, blur_first: bool = True):
        strides = _pair(conv.strides if conv.strides is not None else 1)
        self.blur_first = bool(blur_first)
        if self.blur_first:
            self.blur_stride = (1, 1)
        else:
            self.blur_stride = strides
            conv = nnx.clone(conv)
            conv.strides = (1, 1)
        self.conv = conv

    @classmethod
    def from_conv(cls, conv: nnx.Conv, blur_first: bool = True) -> "BlurConv":
        """Wrap a copy of ``conv`` (same kernel and bias values; the input conv is not modified)."""
        return cls(nnx.clone(conv), blur_first)

    def __call__(self, x: jax.Array, *args, **kwargs) -> jax.Array:
        if self.blur_first:
            return self.conv(blur_2d(x, self.blur_stride), *args, **kwargs)
        return blur_2d(self.conv(x, *args, **kwargs), self.blur_stride)


class BlurMaxPool2d(nnx.Module):
    """Composer's ``BlurMaxPool2d`` on NHWC: the wrapped max-pool with stride 1, then :func:`blur_2d` with the
    pool's stride (Zhang 2019's "MaxBlurPool")."""

    def __init__(self, pool: MaxPool2d):
        self.pool = pool

    def __call__(self, x: jax.Array) -> jax.Array:
        return blur_2d(self.pool(x, stride=1), self.pool.stride)


def _is_strided_conv2d(m: Any, min_channels: int) -> bool:
    if not isinstance(m, nnx.Conv):
        return False
    if len(tuple(m.kernel_size)) != 2:
        return False
    strides = _pair(m.strides if m.strides is not None else 1)
    return max(strides) > 1 and m.in_features >= min_channels


def _apply_blurpool_nnx(model: nnx.Module, replace_convs: bool, replace_maxpools: bool, blur_first: bool,
                        min_channels: int, inplace: bool = False):
    """Swap the eligible convs of ``model`` (``inplace``) or of a clone of it for :class:`BlurConv` and its
    max-pools for :class:`BlurMaxPool2d`; ``(model or the clone, n_blur_maxpools, n_blur_convs)`` in the result.

    Convs already inside a :class:`BlurConv` are left alone, so applying BlurPool twice does not blur twice.
    """
    new = model if inplace else nnx.clone(model)
    if replace_maxpools:  # every max-pool, as Composer's surgery replaces every MaxPool2d
        replace_modules(new, lambda m: isinstance(m, MaxPool2d), lambda pool, i: BlurMaxPool2d(pool),
                        skip=(BlurMaxPool2d,))
    if replace_convs:
        # a conv shared by two parents becomes one BlurConv in both (Composer's surgery does the same); a BlurConv's
        # own conv is not blurred twice
        replace_modules(new, lambda m: _is_strided_conv2d(m, min_channels),
                        lambda conv, i: BlurConv(conv, blur_first), skip=(BlurConv,))
    # As Composer, count the blur layers in the result (a model blurred before does not warn again).
    layers = [m for _, m in nnx.iter_graph(new)]
    return new, sum(isinstance(m, BlurMaxPool2d) for m in layers), sum(isinstance(m, BlurConv) for m in layers)


def apply_blurpool(model: Any, replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True,
                   min_channels: int = 16, optimizers: Any = None, *, inplace: bool | None = None):
    """Composer's ``apply_blurpool(model, replace_convs, replace_maxpools, blur_first, min_channels, optimizers)``;
    a torch optimizer given as ``optimizers`` holds the new layers' parameters afterwards, as in Composer.

    A torch module is edited in place and returned, as Composer does. A Flax NNX module is cloned and the new
    model returned (``model`` is left as it was), as equinox-style surgery does; ``inplace=True`` edits it in place
    instead (what the ``BlurPool`` method does in the Trainer, so the module the user passed is the trained one).
    Warns with :class:`NoEffectWarning` when no layer was replaced.
    """
    with optimizers_follow(model, optimizers, "apply_blurpool"):
        new, n_pool, n_conv = apply_surgery(
            "BlurPool", model, lambda m: _apply_blurpool_nnx(m, replace_convs, replace_maxpools, blur_first,
                                                             int(min_channels), inplace=bool(inplace)),
            who="apply_blurpool", replace_convs=replace_convs, replace_maxpools=replace_maxpools,
            blur_first=blur_first, min_channels=int(min_channels))
    if n_pool == 0 and n_conv == 0:
        warnings.warn(NoEffectWarning(
            f"BlurPool did not change any layers of {type(model).__name__}: no strided Conv2d with in_channels >= "
            f"{min_channels} or MaxPool2d was found."), stacklevel=2)
    return new


def BlurPool(replace_convs: bool = True, replace_maxpools: bool = True, blur_first: bool = True,
             min_channels: int = 16) -> Method:
    """Composer's ``BlurPool(replace_convs=True, replace_maxpools=True, blur_first=True, min_channels=16)`` as a
    :class:`Method` (``model`` slot)."""
    if int(min_channels) != min_channels or min_channels < 0:
        raise ValueError(f"BlurPool: min_channels must be a non-negative integer, got {min_channels}.")
    if not replace_convs and not replace_maxpools:
        warnings.warn(NoEffectWarning("BlurPool: replace_convs and replace_maxpools are both False; BlurPool will "
                                      "not modify the model."), stacklevel=2)

    def model_fn(task, ctx):  # in place, as Composer: the module the user passed becomes the trained, blurred one
        new = apply_blurpool(task.source, replace_convs=replace_convs, replace_maxpools=replace_maxpools,
                             blur_first=blur_first, min_channels=int(min_channels), inplace=True)
        return task.with_model(new)

    return Method(name="BlurPool", model=model_fn,
                  description=f"BlurPool(replace_convs={replace_convs}, replace_maxpools={replace_maxpools}, "
                              f"blur_first={blur_first}, min_channels={min_channels})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="blurpool", factory=BlurPool, functional=(apply_blurpool,))


_TORCH_LAYERS = ('BlurConv2d', 'blurmax_pool2d')  # Composer's torch layers of this method, handed out by the torch adapter


def __getattr__(name: str):
    if name in _TORCH_LAYERS:
        from jaxcomposer.core import adapters
        return adapters.framework_class("torch", name, wanted_by=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
