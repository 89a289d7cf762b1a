"""CutOut.

Method card
-----------
**What it does.** Zeroes ``num_holes`` square holes (over all channels) in the images of a batch. As in Composer,
**one mask is shared by the whole batch** (cheap; the randomness across steps is what regularizes).

**When it helps.** Image classification on small datasets (CIFAR-10: about +0.5-1% accuracy for ResNets). Gains
shrink on large datasets; it is a data augmentation, so it slows convergence on short schedules.

**Hyperparameters.** ``num_holes`` (default ``1``); ``length`` (default ``0.5``): a float is a fraction of
``min(H, W)``, the side being ``int(min(H, W) * length)``; an ``int`` is a side in pixels; ``uniform_sampling``
(default ``False``): draw centres from ``[-side//2, H + side//2)`` (Composer's range) so that border pixels are as
likely to be covered as central ones, instead of uniformly inside the image as in the paper.

**Exact Composer semantics, quirks included.** A hole centred at ``(y, x)`` covers rows
``clip(y - side//2, 0, H) : clip(y + side//2, 0, H)`` (same for columns), so an odd side covers ``side - 1`` pixels
per axis, and holes near a border are clipped.

**How it plugs in.** ``batch`` slot on ``batch['input']`` (``batch(batch, ctx)``, drawing from its own ``ctx.key``;
docs/design.md, "Methods and slots"). The mask is built from ``iota`` comparisons, not dynamic
slices, so it is jit-friendly with static shapes. Images are NHWC by default (``data_format='NCHW'`` supported).

**Functional form.** ``cutout_batch(input, num_holes=1, length=0.5, uniform_sampling=False, *, key=None,
data_format=None)``: Composer's positional arguments (``cf.cutout_batch(x, 2, key=key)`` cuts two holes, as
Composer's ``cf.cutout_batch(x, 2)``), a JAX, numpy or torch array or a PIL image in, the same type out; torch
tensors are NCHW by default, as Composer's, PIL images ``(H, W, C)`` (:mod:`jaxcomposer.algorithms.functional_io`).
The hole centres come from the keyword-only ``key`` instead of numpy's global generator, so a call with holes and no
``key`` raises. Where Composer's ``length`` is always a fraction, an ``int`` here is a side in pixels.

**Reference.** DeVries & Taylor, "Improved Regularization of Convolutional Neural Networks with Cutout", 2017
(arXiv:1708.04552). Composer: ``composer/algorithms/cutout``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.image_layout import model_layout, spatial_axes
from jaxcomposer.core.method import Method, MethodEntry, StepCtx

__all__ = ["cutout_batch", "CutOut"]


def _hole_side(h: int, w: int, length) -> int:
    if isinstance(length, bool):
        raise TypeError("cutout: length must be a float fraction or an int number of pixels, not a bool.")
    if isinstance(length, int):
        side = length
    else:
        side = int(min(h, w) * float(length))
    if side < 0:
        raise ValueError(f"cutout: length must be >= 0, got {length}.")
    return side


def _hole_mask(y, x, h: int, w: int, side: int) -> jax.Array:
    """(H, W) bool mask of Composer's ``_generate_mask`` slice ``[y1:y2, x1:x2]``, from iota comparisons."""
    half = side // 2
    y1, y2 = jnp.clip(y - half, 0, h), jnp.clip(y + half, 0, h)
    x1, x2 = jnp.clip(x - half, 0, w), jnp.clip(x + half, 0, w)
    rows = jnp.arange(h)[:, None]
    cols = jnp.arange(w)[None, :]
    return (rows >= y1) & (rows < y2) & (cols >= x1) & (cols < x2)


@functional_form(arrays=("input",), pil=True)
def cutout_batch(input: jax.Array, num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False, *,
                 key: jax.Array | None = None, data_format: str | None = None) -> jax.Array:
    """Composer's ``cutout_batch(input, num_holes=1, length=0.5, uniform_sampling=False)``: one image ``(H, W, C)``
    or a batch ``(N, H, W, C)`` (channels first with ``data_format='NCHW'``, the default for torch tensors), or a
    PIL image, with ``num_holes`` holes zeroed (one mask for the whole batch).

    The hole centres are drawn from ``key`` (keyword-only), needed when ``num_holes > 0``. Returns the caller's
    type (:mod:`jaxcomposer.algorithms.functional_io`); with no holes, the input itself.
    """
    if input.ndim < 3:
        raise ValueError(f"cutout: expected an image (3 dims) or a batch of images (4 dims), got shape {input.shape}.")
    ay, ax = spatial_axes(input.ndim, data_format, "cutout")
    h, w = input.shape[ay], input.shape[ax]
    side = _hole_side(h, w, length)
    if int(num_holes) != num_holes or num_holes < 0:
        raise ValueError(f"cutout_batch: num_holes must be a non-negative integer, got {num_holes!r}.")
    if num_holes == 0:
        return input
    key = require_key(key, "cutout_batch", f"the centres of {num_holes} hole(s)")
    hole = jnp.zeros((h, w), bool)
    for k in jax.random.split(key, int(num_holes)):
        ky, kx = jax.random.split(k)
        if uniform_sampling:  # Python's floor division, as np.random.randint(-length // 2, h + length // 2)
            y = jax.random.randint(ky, (), -side // 2, h + side // 2)
            x = jax.random.randint(kx, (), -side // 2, w + side // 2)
        else:
            y = jax.random.randint(ky, (), 0, h)
            x = jax.random.randint(kx, (), 0, w)
        hole = hole | _hole_mask(y, x, h, w, side)
    # Broadcast the (H, W) mask to the input's rank explicitly (implicit rank promotion is an error in this suite).
    shape = [1] * input.ndim
    shape[ay], shape[ax] = h, w
    return jnp.where(hole.reshape(shape), jnp.zeros((), input.dtype), input)


def CutOut(num_holes: int = 1, length: float = 0.5, uniform_sampling: bool = False, input_key: str = "input",
           data_format: str | None = None) -> Method:
    """Composer's ``CutOut(num_holes=1, length=0.5, uniform_sampling=False)`` as a :class:`Method` (``batch``).
    ``data_format=None`` follows the model's layout (NCHW for a bridged torch model, NHWC for NNX)."""
    if int(num_holes) != num_holes or num_holes < 0:
        raise ValueError(f"CutOut: num_holes must be a non-negative integer, got {num_holes}.")
    if isinstance(length, int) and not isinstance(length, bool) and length < 0:
        raise ValueError(f"CutOut: an int length is a side in pixels and must be >= 0, got {length}.")
    if not isinstance(length, int) and not 0.0 <= float(length) <= 1.0:
        raise ValueError(f"CutOut: a float length is a fraction of min(H, W) and must be in [0, 1], got {length}.")
    if data_format is not None:
        spatial_axes(4, data_format, "cutout")  # validate now, not at trace time

    def batch_fn(batch: dict, ctx: StepCtx) -> dict:
        return {**batch, input_key: cutout_batch(batch[input_key], int(num_holes), length, uniform_sampling,
                                                 key=ctx.key, data_format=model_layout(data_format, ctx))}

    return Method(name="CutOut", batch=batch_fn,
                  description=f"CutOut(num_holes={num_holes}, length={length}, uniform_sampling={uniform_sampling})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="cutout", factory=CutOut, functional=(cutout_batch,))
