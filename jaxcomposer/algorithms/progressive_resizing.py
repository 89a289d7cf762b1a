"""ProgressiveResizing.

Method card
-----------
**What it does.** Trains on downscaled images early on and grows them back to full size. The scale goes from
``initial_scale`` to 1 linearly between ``delay_fraction`` and ``1 - finetune_fraction`` of training, and the last
``finetune_fraction`` runs at full size. Images are shrunk by interpolation (``mode='resize'``) or by one random crop
per batch (``mode='crop'``).

**When it helps.** Convolutional image classifiers whose cost scales with pixels (ResNet-50 on ImageNet: about 1.3x
faster to the same accuracy in Composer's runs); small images already cost little. The network must accept any
input size (global pooling before the head).

**Hyperparameters** (Composer's names and defaults). ``mode='resize'`` (``'resize'`` or ``'crop'``);
``initial_scale=0.5``; ``finetune_fraction=0.2``; ``delay_fraction=0.5``; ``size_increment=4``;
``resize_targets=False`` (also resize ``(N, H, W)`` label maps or ``(N, H, W, C)`` dense targets, for
segmentation). Additions: ``input_key='input'``, ``target_key='target'``, ``data_format=None`` (the model's
layout: ``'NCHW'`` for a bridged torch model, whose batches keep torch's layout, ``'NHWC'`` for a JAX/NNX model;
``'NHWC'`` or ``'NCHW'`` forces one),
``interpolation='nearest'`` (what Composer's ``resize`` does; ``'bilinear'`` as ``F.interpolate(mode='bilinear',
align_corners=False)``, no antialiasing) and ``image_size=None`` (see "How it plugs in").

**Exact Composer semantics, quirks included.** At elapsed fraction ``t = step / total_steps`` the scale is
``s = initial_scale + (1 - initial_scale) * min(max(0, t - delay) / (1 - finetune - delay), 1)`` (a zero-length
ramp jumps to 1 at ``delay``; Composer divides by zero there). The width is pinned to
``round(W * s / size_increment) * size_increment`` (Python's half-to-even ``round``) and the *pinned* factor
``scale_factor = pinned_width / W`` is applied to both sides: the output is ``floor(H * scale_factor)`` by
``floor(W * scale_factor)``, exactly ``F.interpolate(scale_factor=...)``'s size, which can be one pixel under the
pinned width (W=44, pinned 30: 29). A factor >= 1 leaves the batch unchanged, so when ``W`` is not a multiple of
``size_increment`` the "full size" phase may still shrink (W=10, increment 4: 8 pixels). ``'nearest'`` reads
source pixel ``min(floor(i * float32(1 / scale_factor)), n - 1)`` (torch's legacy nearest). ``'crop'`` keeps an
``int(scale_factor * H)`` by ``int(scale_factor * W)`` window whose corner is drawn from ``[0, H - Hc)`` by
``[0, W - Wc)`` (``torch.randint``'s range: the last offset is never drawn), one window for the whole batch; with
``resize_targets`` the target window is the same region scaled to the target's size. Targets are always resized
with nearest, so label maps are never blended.

**How it plugs in.** ``stage`` slot (host, every step): ``stage(batch_shapes, ctx)`` reads the clock
(``ctx.step`` over ``ctx.run.total_steps``) and returns the pinned ``scale_factor`` (a float; ``1.0`` once the
batch is left unchanged), so each distinct size is one static shape and one compile. Pinning needs the full-size
width, taken from ``batch_shapes`` when the stage is given them or else from ``image_size``. ``batch`` slot (in
jit): resizes ``batch[input_key]`` (and the target) by ``ctx.stage``; the crop offset comes from ``ctx.key``. Only
4-D image batches are resized (Composer's ``resize_batch`` needs ``(N, C, H, W)``); anything else raises, as does
a missing stage. Evaluation always sees full-size images. Composer's scale follows its elapsed-duration fraction,
which for ``max_duration`` in epochs only advances at epoch ends; here it advances every batch (same buckets,
reached at batch rather than epoch granularity). See docs/design.md, "Methods and slots" and "The clock".

**Functional form.** ``resize_batch(input, target, scale_factor, mode='resize', resize_targets=False, *, key=None,
data_format=None, interpolation='nearest')``: Composer's positional arguments, JAX, numpy or torch arrays in, the
same type out; torch tensors are NCHW by default, as Composer's (:mod:`jaxcomposer.algorithms.functional_io`). Only
``mode='crop'`` draws (its window, from the keyword-only ``key``, where Composer uses torch's global generator); a
factor >= 1 returns the caller's own objects.

**Reference.** Howard & Gugger, fastai's progressive resizing (fastbook, chapter 7, 2020); Touvron et al., "Fixing
the train-test resolution discrepancy", NeurIPS 2019 (arXiv:1906.06423). Composer:
``composer/algorithms/progressive_resizing``.
"""
from __future__ import annotations

import math
from typing import Any, Hashable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.image_layout import model_layout, spatial_axes
from jaxcomposer.core.method import Method, MethodEntry, StepCtx, require_stage

__all__ = ["resize_batch", "ProgressiveResizing"]

_VALID_MODES = ("crop", "resize")
_INTERPOLATIONS = ("nearest", "bilinear")


def _output_size(n: int, scale_factor: float) -> int:
    # F.interpolate's output size for a scale factor (recompute_scale_factor=False): the double product, truncated.
    return int(math.floor(float(n) * scale_factor))


def _nearest_index(n_in: int, n_out: int, scale_factor: float) -> np.ndarray:
    """Source index per output index, as torch's legacy ``nearest`` computes it (in float32, with 1/scale)."""
    if n_out == n_in:
        return np.arange(n_out)
    if n_out == 2 * n_in:
        return np.arange(n_out) >> 1
    inv = np.float32(1.0 / scale_factor)
    idx = np.floor(np.arange(n_out, dtype=np.float32) * inv).astype(np.int64)
    return np.minimum(idx, n_in - 1)


def _linear_weights(n_in: int, n_out: int, scale_factor: float):
    """(i0, i1, w0, w1) per output index for ``align_corners=False`` linear interpolation, as torch's CPU kernel."""
    inv = np.float64(np.float32(1.0 / scale_factor))
    # (i + 0.5) * scale - 0.5 rounded once to float32, as the fused multiply-add torch's kernel compiles to (the
    # product is exact in float64); rounding twice moves the weights by up to an ulp of the source position.
    src = ((np.arange(n_out) + 0.5) * inv - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0.0))
    i0 = src.astype(np.int64)
    w1 = np.minimum(src - i0.astype(np.float32), np.float32(1.0))
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    return i0, i1, np.float32(1.0) - w1, w1


def _weights_along(w: np.ndarray, ndim: int, axis: int) -> jax.Array:
    shape = [1] * ndim
    shape[axis] = w.shape[0]
    return jnp.asarray(w.reshape(shape))


def _interpolate(x: jax.Array, axes: tuple[int, int], scale_factor: float, interpolation: str) -> jax.Array:
    """Resize ``x`` along its two spatial ``axes``; the indices and weights are static (shapes are)."""
    for axis in axes:
        n_in = x.shape[axis]
        n_out = _output_size(n_in, scale_factor)
        if interpolation == "nearest":
            x = jnp.take(x, jnp.asarray(_nearest_index(n_in, n_out, scale_factor)), axis=axis)
        else:
            i0, i1, w0, w1 = _linear_weights(n_in, n_out, scale_factor)
            xf = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
            w0, w1 = (_weights_along(w, x.ndim, axis).astype(xf.dtype) for w in (w0, w1))
            y = jnp.take(xf, jnp.asarray(i0), axis=axis) * w0 + jnp.take(xf, jnp.asarray(i1), axis=axis) * w1
            x = y if y.dtype == x.dtype else jnp.round(y).astype(x.dtype)
    return x


def _crop(x: jax.Array, axes: tuple[int, int], starts, sizes: tuple[int, int]) -> jax.Array:
    start = [0] * x.ndim
    size = list(x.shape)
    for axis, s, n in zip(axes, starts, sizes):
        start[axis], size[axis] = s, n
    return jax.lax.dynamic_slice(x, [jnp.asarray(s, jnp.int32) for s in start], size)


def _index_target_axes(target: jax.Array, data_format: str) -> tuple[int, int]:
    # (N, H, W) label maps have their spatial axes at 1, 2 in either layout.
    return (1, 2) if target.ndim == 3 else spatial_axes(4, data_format, "resize_batch")


@functional_form(arrays=("input", "target"))
def resize_batch(input: jax.Array, target: jax.Array | None, scale_factor: float, mode: str = "resize",
                 resize_targets: bool = False, *, key: jax.Array | None = None, data_format: str | None = None,
                 interpolation: str = "nearest") -> tuple[jax.Array, jax.Array]:
    """Composer's ``resize_batch(input, target, scale_factor, mode='resize', resize_targets=False)``: returns
    ``(input, target)`` shrunk by ``scale_factor`` (static, a Python float).

    ``mode='resize'`` interpolates (``interpolation='nearest'`` as Composer, or ``'bilinear'``); ``mode='crop'``
    keeps one random window for the whole batch, drawn from ``key`` (keyword-only, needed for ``'crop'`` only).
    ``input`` is ``(N, H, W, C)``, or ``(N, C, H, W)`` with ``data_format='NCHW'`` (the default for torch tensors);
    with ``resize_targets``, ``target`` is an ``(N, H, W)`` label map or a 4-D tensor in the same layout. A factor
    >= 1 returns both unchanged (the caller's own objects, as Composer's); results come back in the caller's type
    (:mod:`jaxcomposer.algorithms.functional_io`).
    """
    if mode not in _VALID_MODES:
        raise ValueError(f"resize_batch: mode must be one of {_VALID_MODES}, got {mode!r}.")
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"resize_batch: interpolation must be one of {_INTERPOLATIONS}, got {interpolation!r}.")
    axes = spatial_axes(4, data_format, "resize_batch")
    if input.ndim != 4:
        raise ValueError(f"resize_batch: input must be a 4-D image batch ({data_format}), got shape {input.shape}. "
                         "Progressive resizing only applies to images.")
    if resize_targets and target.ndim < 3:
        raise ValueError(f"resize_batch: resize_targets=True needs (N, H, W) or 4-D targets, got shape {target.shape}.")
    scale_factor = float(scale_factor)
    if scale_factor >= 1:
        return input, target
    if scale_factor <= 0:
        raise ValueError(f"resize_batch: scale_factor must be > 0, got {scale_factor}.")
    h, w = input.shape[axes[0]], input.shape[axes[1]]
    if min(_output_size(h, scale_factor), _output_size(w, scale_factor)) < 1:
        raise ValueError(f"resize_batch: scale_factor={scale_factor} shrinks a {h}x{w} image to nothing.")
    t_axes = _index_target_axes(target, data_format) if resize_targets else None

    if mode == "resize":
        out = _interpolate(input, axes, scale_factor, interpolation)
        if resize_targets:
            target = _interpolate(target, t_axes, scale_factor, "nearest")
        return out, target

    key = require_key(key, "resize_batch", "the position of the window mode='crop' keeps")
    hc, wc = int(scale_factor * h), int(scale_factor * w)
    k_top, k_left = jax.random.split(key)
    top = jax.random.randint(k_top, (), 0, h - hc)
    left = jax.random.randint(k_left, (), 0, w - wc)
    out = _crop(input, axes, (top, left), (hc, wc))
    if resize_targets:
        th, tw = target.shape[t_axes[0]], target.shape[t_axes[1]]
        # The same region at the target's resolution: Composer's int(ratio * top), here in exact integer arithmetic.
        target = _crop(target, t_axes, (top * th // h, left * tw // w),
                       (int(scale_factor * th), int(scale_factor * tw)))
    return out, target


def scale_at(t: float, initial_scale: float, delay_fraction: float, finetune_fraction: float) -> float:
    """Composer's unpinned scale at elapsed fraction ``t``."""
    if t < delay_fraction:
        frac = 0.0
    else:
        ramp = 1.0 - finetune_fraction - delay_fraction
        frac = 1.0 if ramp <= 0 else min((t - delay_fraction) / ramp, 1.0)
    return initial_scale + (1.0 - initial_scale) * frac


def ProgressiveResizing(mode: str = "resize", initial_scale: float = 0.5, finetune_fraction: float = 0.2,
                        delay_fraction: float = 0.5, size_increment: int = 4, resize_targets: bool = False,
                        input_key: str = "input", target_key: str = "target", data_format: str | None = None,
                        interpolation: str = "nearest", image_size: int | tuple[int, int] | None = None) -> Method:
    """Composer's ``ProgressiveResizing(mode='resize', initial_scale=0.5, finetune_fraction=0.2,
    delay_fraction=0.5, size_increment=4, resize_targets=False)`` as a :class:`Method` (``stage`` + ``batch``).

    ``data_format=None`` follows the model's layout (``ctx.model.param_layout``): NCHW batches for a bridged torch
    model, NHWC for a JAX/NNX model."""
    if mode not in _VALID_MODES:
        raise ValueError(f"ProgressiveResizing: mode must be one of {_VALID_MODES}, got {mode!r}.")
    if not 0 <= initial_scale <= 1:
        raise ValueError(f"ProgressiveResizing: initial_scale must be in [0, 1], got {initial_scale}.")
    if not 0 <= finetune_fraction <= 1:
        raise ValueError(f"ProgressiveResizing: finetune_fraction must be in [0, 1], got {finetune_fraction}.")
    if not 0 <= delay_fraction <= 1:
        raise ValueError(f"ProgressiveResizing: delay_fraction must be in [0, 1], got {delay_fraction}.")
    if delay_fraction + finetune_fraction > 1:
        raise ValueError(f"ProgressiveResizing: delay_fraction + finetune_fraction must be <= 1, got "
                         f"{delay_fraction} + {finetune_fraction} = {delay_fraction + finetune_fraction}.")
    if isinstance(size_increment, bool) or int(size_increment) != size_increment or size_increment < 1:
        raise ValueError(f"ProgressiveResizing: size_increment must be a positive integer, got {size_increment!r}.")
    if interpolation not in _INTERPOLATIONS:
        raise ValueError(f"ProgressiveResizing: interpolation must be one of {_INTERPOLATIONS}, got "
                         f"{interpolation!r}.")
    if data_format is not None:
        spatial_axes(4, data_format, "ProgressiveResizing")  # validate now, not at the first step
    if image_size is not None:
        hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(hw) != 2 or any(isinstance(n, bool) or int(n) != n or n < 1 for n in hw):
            raise ValueError(f"ProgressiveResizing: image_size must be a positive int or (H, W), got {image_size!r}.")
        image_size = (int(hw[0]), int(hw[1]))
    initial_scale, finetune_fraction, delay_fraction = float(initial_scale), float(finetune_fraction), \
        float(delay_fraction)
    size_increment = int(size_increment)

    def full_width(batch_shapes: Mapping[str, Any] | None, layout: str) -> int:
        if batch_shapes is not None and input_key in batch_shapes:
            shape = tuple(getattr(batch_shapes[input_key], "shape", batch_shapes[input_key]))
            if len(shape) != 4:
                raise ValueError(f"ProgressiveResizing: batch[{input_key!r}] has shape {shape}; expected a 4-D image "
                                 f"batch ({layout}). Progressive resizing only applies to images.")
            return int(shape[spatial_axes(4, layout, "ProgressiveResizing")[1]])
        if image_size is not None:
            return image_size[1]
        raise ValueError("ProgressiveResizing: the stage needs the full-size image width to pin sizes to "
                         "size_increment: call stage(batch_shapes, ctx) with the batch's shapes, or "
                         "pass image_size=(H, W) to ProgressiveResizing.")

    def stage(batch_shapes: Mapping[str, Any] | None, ctx: StepCtx) -> Hashable:
        scale = scale_at(int(ctx.step) / max(ctx.run.total_steps, 1), initial_scale, delay_fraction,
                          finetune_fraction)
        width = full_width(batch_shapes, model_layout(data_format, ctx))
        pinned = round(width * scale / size_increment) * size_increment
        if pinned < 1:
            raise ValueError(f"ProgressiveResizing: a {width}-pixel-wide image at scale {scale:.3f} pins to 0 pixels "
                             f"with size_increment={size_increment}; raise initial_scale or lower size_increment.")
        # Every factor >= 1 leaves the batch unchanged: one stage value for all of them, so one compile.
        return min(pinned / width, 1.0)

    def batch_fn(batch: dict, ctx: StepCtx) -> dict:
        scale = require_stage(ctx, "ProgressiveResizing", "the batch slot needs the static scale factor that its stage "
                              "slot computes on the host. The Trainer passes it; in your own loop pass "
                              "method.stage(batch_shapes, ctx) as the step's static stage, or call resize_batch "
                              "directly.")
        x, layout = batch[input_key], model_layout(data_format, ctx)
        if x.ndim != 4:
            raise ValueError(f"ProgressiveResizing: batch[{input_key!r}] has shape {x.shape}; expected a 4-D image "
                             f"batch ({layout}). Progressive resizing only applies to images.")
        if resize_targets and target_key not in batch:
            raise KeyError(f"ProgressiveResizing: resize_targets=True but the batch has no {target_key!r} entry.")
        target = batch.get(target_key)
        new_x, new_target = resize_batch(x, target, scale, mode=mode, resize_targets=resize_targets,
                                         key=ctx.key, data_format=layout, interpolation=interpolation)
        out = {**batch, input_key: new_x}
        if resize_targets:
            out[target_key] = new_target
        return out

    return Method(name="ProgressiveResizing", batch=batch_fn, stage=stage,
                  description=(f"ProgressiveResizing(mode={mode!r}, initial_scale={initial_scale}, "
                               f"finetune_fraction={finetune_fraction}, delay_fraction={delay_fraction}, "
                               f"size_increment={size_increment}, resize_targets={resize_targets})"))


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="progressive_resizing", factory=ProgressiveResizing, functional=(resize_batch,))
