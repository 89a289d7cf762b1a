"""CutMix.

Method card
-----------
**What it does.** Pastes a random box from a permuted copy of the batch into every image and mixes the labels by
the pasted area. ``lam ~ Beta(alpha, alpha)``: a box of area fraction about ``1 - lam`` replaces the same region of
each image with that of image ``perm[i]``, and the targets become ``lam_adj * onehot(y) + (1 - lam_adj) *
onehot(y[perm])``, where ``lam_adj = 1 - box_area / (H * W)`` is measured on the box *after* clipping to the image.
One box and one permutation per batch, as in Composer.

**When it helps.** Image classification trained long enough to overfit: a regularizer that improves
generalization (the paper also reports better localization and robustness) while keeping images locally natural,
at negligible compute. Like other regularizers it slows convergence on short schedules and shows diminishing
returns when stacked with others; not for language models.

**Hyperparameters.** ``alpha`` (default ``1.0``, the paper's value; ``0`` gives ``lam = 0``: the box side is the
full image size and only its clipping against the border leaves part of the original); ``interpolate_loss``
(default ``False``): when ``True`` the loss is ``lam_adj * L(y) + (1 - lam_adj) * L(y[perm])`` instead of the loss
on mixed targets (identical for cross-entropy, works for losses that need index targets); ``uniform_sampling``
(default ``False``): draw the box centre from ``[-cut // 2, H + cut // 2)`` per axis so every pixel is equally
likely to be covered, instead of uniformly inside the image as in the paper.

**Exact Composer semantics, quirks included.** ``cut_h = int(H * sqrt(1 - lam))`` (same for ``W``); a centre ``cy``
covers rows ``clip(cy - cut_h // 2, 0, H) : clip(cy + cut_h // 2, 0, H)``, so an odd cut covers ``cut - 1`` rows.
``bbox`` is ``(row_start, col_start, row_end, col_end)``: the order in which Composer's ``(x1, y1, x2, y2)`` tuple
actually slices an NCHW tensor (its first pair indexes ``H``). Segmentation targets (the target has the input's
spatial size) get the box pasted instead of being interpolated, and ``interpolate_loss=True`` is an error for them.
One deviation: ``cutmix_batch(length=...)`` draws a box of side ``int(length * H) x int(length * W)`` as Composer's
docstring says; Composer's code feeds that area into ``sqrt(1 - lam)`` and so draws a larger box.

**How it plugs in.** ``batch`` slot (``batch(batch, ctx)``, drawing from its own ``ctx.key``; docs/design.md,
"Methods and slots"): pastes into ``batch['input']`` (the box is a mask from ``iota`` comparisons,
so shapes stay static under jit) and stores, per example so microbatch splits along axis 0 stay correct,
``batch['cutmix/target_perm']`` and ``batch['cutmix/lambda']`` (``lam_adj`` broadcast to ``(B,)``). ``loss`` slot:
uses them; without those keys (evaluation) it is the identity. Images are NHWC by default (``data_format='NCHW'``
supported). Declares ``exclusive={"interpolates_targets"}``, so ``compose`` raises if any other method of the
recipe also interpolates targets (MixUp).

**Functional form** (the area comes back as a Python float and the box as ints, as Composer's, except when traced
under ``jax.jit``). ``cutmix_batch(input, target, length=None, alpha=1.0, bbox=None, indices=None,
uniform_sampling=False, *, key=None, data_format=None)``: Composer's positional arguments, JAX, numpy or torch
arrays in, the same type out; torch tensors are NCHW by default, as Composer's
(:mod:`jaxcomposer.algorithms.functional_io`). The box and permutation come from the keyword-only ``key`` instead of
Composer's global generators; pass both ``bbox`` and ``indices`` to reproduce a draw of Composer's without one.

**Reference.** Yun et al., "CutMix: Regularization Strategy to Train Strong Classifiers with Localizable
Features", ICCV 2019 (arXiv:1905.04899). Composer: ``composer/algorithms/cutmix``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.image_layout import model_layout, spatial_axes
from jaxcomposer.algorithms.sampling import symmetric_beta
from jaxcomposer.core.method import Method, MethodEntry, StepCtx
from jaxcomposer.loss import ensure_targets_one_hot

__all__ = ["cutmix_batch", "CutMix", "LAMBDA_KEY", "TARGET_PERM_KEY"]

TARGET_PERM_KEY = "cutmix/target_perm"
LAMBDA_KEY = "cutmix/lambda"


def _gen_cutmix_coef(key: jax.Array, alpha: float) -> jax.Array:
    if alpha == 0:  # Beta(0, 0) is undefined; Composer treats alpha=0 as lam = 0.
        return jnp.zeros((), jnp.float32)
    return jnp.clip(symmetric_beta(key, alpha), 0.0, 1.0)


def _rand_bbox(key: jax.Array, h: int, w: int, cut_h, cut_w, uniform_sampling: bool):
    """Composer's ``_rand_bbox`` for given cut sizes (ints or traced): a random centre, then the clipped box."""
    ky, kx = jax.random.split(key)
    if uniform_sampling:  # floor division of the negated cut, as np.random.randint(-cut // 2, H + cut // 2)
        cy = jax.random.randint(ky, (), (-cut_h) // 2, h + cut_h // 2)
        cx = jax.random.randint(kx, (), (-cut_w) // 2, w + cut_w // 2)
    else:
        cy = jax.random.randint(ky, (), 0, h)
        cx = jax.random.randint(kx, (), 0, w)
    return _clipped_box(cy, cx, cut_h, cut_w, h, w)


def _clipped_box(cy, cx, cut_h, cut_w, h: int, w: int):
    """The box centred at (cy, cx) clipped to the image; an odd cut loses a pixel to the floor divisions."""
    return (jnp.clip(cy - cut_h // 2, 0, h), jnp.clip(cx - cut_w // 2, 0, w),
            jnp.clip(cy + cut_h // 2, 0, h), jnp.clip(cx + cut_w // 2, 0, w))


def _box_mask(bbox, h: int, w: int) -> jax.Array:
    """(H, W) bool mask of the slice ``[r1:r2, c1:c2]``, from iota comparisons (no dynamic shapes)."""
    r1, c1, r2, c2 = bbox
    rows = jnp.arange(h)[:, None]
    cols = jnp.arange(w)[None, :]
    return (rows >= r1) & (rows < r2) & (cols >= c1) & (cols < c2)


def _paste(x: jax.Array, x_perm: jax.Array, mask: jax.Array, axes: tuple[int, int]) -> jax.Array:
    # Broadcast the (H, W) mask to x's rank explicitly (implicit rank promotion is an error in this suite).
    shape = [1] * x.ndim
    shape[axes[0]], shape[axes[1]] = mask.shape
    return jnp.where(mask.reshape(shape), x_perm, x)


def _spatial_target_axes(target: jax.Array, h: int, w: int, data_format: str) -> tuple[int, int] | None:
    """Where a segmentation target keeps the input's (H, W), or None for class targets.

    Composer's rule is ``target.ndim > 2 and target.shape[-2:] == input.shape[-2:]`` in NCHW; in NHWC the spatial
    axes of a ``(B, H, W)`` or ``(B, H, W, K)`` target are 1 and 2.
    """
    if target.ndim <= 2:
        return None
    axes = (target.ndim - 2, target.ndim - 1) if data_format == "NCHW" else (1, 2)
    return axes if (target.shape[axes[0]], target.shape[axes[1]]) == (h, w) else None


@functional_form(arrays=("input", "target", "bbox", "indices"))
def cutmix_batch(input: jax.Array, target: jax.Array, length: float | None = None, alpha: float = 1.0, bbox=None,
                 indices: jax.Array | None = None, uniform_sampling: bool = False, *, key: jax.Array | None = None,
                 data_format: str | None = None):
    """Composer's ``cutmix_batch(input, target, length=None, alpha=1.0, bbox=None, indices=None,
    uniform_sampling=False)``: returns ``(mixed_input, target[perm], lam_adj, bbox)``.

    ``lam_adj`` is the fraction of each image left unmixed (the weight of the original targets) and ``bbox`` is
    ``(row_start, col_start, row_end, col_end)`` as int32 scalars. ``bbox`` and ``indices`` (a permutation of
    ``range(B)``) are drawn from ``key`` (keyword-only) when not given, so ``key`` is needed unless both are.
    ``length`` (a fraction of ``H`` and of ``W``) fixes the box size instead of drawing it from ``Beta(alpha,
    alpha)``; it cannot be combined with ``bbox``. Images are NHWC, or NCHW with ``data_format='NCHW'`` (the
    default for torch tensors); results come back in the caller's type
    (:mod:`jaxcomposer.algorithms.functional_io`).
    """
    if bbox is not None and length is not None:
        raise ValueError(f"cutmix_batch: cannot provide both length and bbox; got {length} and {bbox}.")
    if alpha < 0:
        raise ValueError(f"cutmix_batch: alpha must be >= 0, got {alpha}.")
    if length is not None and not 0.0 <= float(length) <= 1.0:
        raise ValueError(f"cutmix_batch: length is a fraction of H and W and must be in [0, 1], got {length}.")
    if bbox is None or indices is None:
        key = require_key(key, "cutmix_batch", "the box and the permutation (pass both bbox= and indices= to draw nothing)")
    if input.ndim != 4:
        raise ValueError(f"cutmix_batch: expected a batch of images (4 dims, {data_format}), got shape "
                         f"{tuple(input.shape)}.")
    ay, ax = spatial_axes(input.ndim, data_format, "cutmix")
    h, w = input.shape[ay], input.shape[ax]
    if bbox is None or indices is None:
        k_lam, k_box, k_perm = jax.random.split(key, 3)
    indices = jax.random.permutation(k_perm, input.shape[0]) if indices is None else jnp.asarray(indices)
    if bbox is None:
        if length is None:
            cut_ratio = jnp.sqrt(1.0 - _gen_cutmix_coef(k_lam, alpha))
            # Composer takes int() of a float64 product; in float32 the floor can differ only when h * ratio lies
            # within float32 rounding of an integer, so the box size moves by a pixel for a tiny fraction of draws.
            cut_h = jnp.floor(h * cut_ratio).astype(jnp.int32)
            cut_w = jnp.floor(w * cut_ratio).astype(jnp.int32)
        else:
            cut_h, cut_w = int(float(length) * h), int(float(length) * w)
        bbox = _rand_bbox(k_box, h, w, cut_h, cut_w, uniform_sampling)
    bbox = tuple(jnp.asarray(b, jnp.int32) for b in bbox)
    if len(bbox) != 4:
        raise ValueError(f"cutmix_batch: bbox must be (row_start, col_start, row_end, col_end), got {bbox}.")
    mixed = _paste(input, input[indices], _box_mask(bbox, h, w), (ay, ax))
    r1, c1, r2, c2 = bbox
    adjusted = 1.0 - ((r2 - r1) * (c2 - c1)).astype(jnp.float32) / (h * w)
    if not isinstance(adjusted, jax.core.Tracer):  # Composer returns a float area and an int box, not tensors
        adjusted, bbox = float(adjusted), tuple(int(b) for b in bbox)
    return mixed, target[indices], adjusted, bbox


def _per_example(lam: jax.Array, like: jax.Array) -> jax.Array:
    # (B,) -> (B, 1, ..., 1): explicit, because the suite forbids implicit rank promotion.
    return lam.reshape(lam.shape + (1,) * (like.ndim - 1))


def CutMix(alpha: float = 1.0, interpolate_loss: bool = False, uniform_sampling: bool = False,
           input_key: str = "input", target_key: str = "target", data_format: str | None = None) -> Method:
    """Composer's ``CutMix(alpha=1.0, interpolate_loss=False, uniform_sampling=False)`` as a :class:`Method`
    (``batch`` + ``loss`` slots). ``data_format=None`` follows the model's layout (NCHW for a bridged torch model, NHWC for NNX)."""
    alpha = float(alpha)
    if alpha < 0:
        raise ValueError(f"CutMix: alpha must be >= 0, got {alpha}.")
    if data_format is not None:
        spatial_axes(4, data_format, "cutmix")  # validate now, not at trace time

    def batch_fn(batch: dict, ctx: StepCtx) -> dict:
        x, y, layout = batch[input_key], batch[target_key], model_layout(data_format, ctx)
        mixed, target_perm, lam, bbox = cutmix_batch(x, y, alpha=alpha, uniform_sampling=uniform_sampling,
                                                     key=ctx.key, data_format=layout)
        ay, ax = spatial_axes(x.ndim, layout, "cutmix")
        h, w = x.shape[ay], x.shape[ax]
        seg_axes = _spatial_target_axes(y, h, w, layout)
        if seg_axes is not None:
            # Segmentation: the label of each pixel is known exactly, so paste it rather than interpolate.
            if interpolate_loss:
                raise ValueError("CutMix: interpolate_loss=True is not possible when the target has the input's "
                                 f"height and width (got target shape {tuple(y.shape)}); use interpolate_loss=False.")
            return {**batch, input_key: mixed, target_key: _paste(y, target_perm, _box_mask(bbox, h, w), seg_axes)}
        return {**batch, input_key: mixed, TARGET_PERM_KEY: target_perm,
                LAMBDA_KEY: jnp.full((x.shape[0],), lam, jnp.float32)}

    def wrap(loss_fn: Callable, ctx: StepCtx) -> Callable:
        del ctx  # the mixing travels in the batch (per example), not in the ctx

        def mixed_loss(outputs, batch):
            if LAMBDA_KEY not in batch:  # evaluation, segmentation targets, or a batch this method did not see
                return loss_fn(outputs, batch)
            lam, target_perm = batch[LAMBDA_KEY], batch[TARGET_PERM_KEY]
            rest = {k: v for k, v in batch.items() if k not in (LAMBDA_KEY, TARGET_PERM_KEY)}
            if interpolate_loss:
                return lam * loss_fn(outputs, rest) + (1 - lam) * loss_fn(outputs, {**rest, target_key: target_perm})
            y = ensure_targets_one_hot(outputs, rest[target_key])
            y_perm = ensure_targets_one_hot(outputs, target_perm)
            lam_t = _per_example(lam, y)
            return loss_fn(outputs, {**rest, target_key: lam_t * y + (1 - lam_t) * y_perm})

        return mixed_loss

    return Method(name="CutMix", batch=batch_fn, loss=wrap, exclusive={"interpolates_targets"},
                  description=f"CutMix(alpha={alpha}, interpolate_loss={interpolate_loss}, "
                              f"uniform_sampling={uniform_sampling})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="cutmix", factory=CutMix, functional=(cutmix_batch,))
