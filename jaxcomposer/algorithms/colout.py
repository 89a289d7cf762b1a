"""ColOut.

Method card
-----------
**What it does.** Drops a random fraction of the rows and columns of the images, keeping the survivors in order,
so every image shrinks to ``int((1 - p_row) * H) x int((1 - p_col) * W)``. Spatial targets (segmentation masks of
the input's size) lose the same rows and columns.

**When it helps.** Image classification with a model that pools globally (ResNets), as a speed/quality trade: the
smaller images make each step cheaper (about ``(1 - p)^2`` of the pixels) for a small accuracy cost (Composer
measured about -0.2% top-1 on ImageNet and -1% on CIFAR-10, still a Pareto improvement for ResNet-50 and ResNet-56;
its hot ResNet-50 recipe uses ``p_row = p_col = 0.05``). Diminishing returns with other size-reducing methods
(ProgressiveResizing). It needs a model that accepts any image size: a model whose first layer has a fixed fan-in
(an MLP on flattened pixels) rejects the shrunk images.

**Hyperparameters.** ``p_row``, ``p_col`` (default ``0.15`` each, in ``[0, 1]``): the fraction of rows and columns
dropped; ``batch`` (default ``True``): drop the same rows and columns from the whole batch (Composer's
``AFTER_DATALOADER`` mode); ``False`` draws them per example (Composer's per-sample dataset transform); the output
shape is the same either way. ``resize_target`` (default ``'auto'``): also drop them from the target when it has
the input's spatial size (``True``/``False`` force it).

**Exact Composer semantics.** The kept rows are the first ``int((1 - p_row) * H)`` entries of a random permutation
of ``range(H)``, sorted (same for columns); the count is static, so the output shape is fixed by the config and the
input shape, and jit compiles it once. ``'auto'`` resizes a target with more than 2 dims whose spatial size equals
the input's (a ``(B, H, W)`` or ``(B, H, W, K)`` mask in NHWC; Composer's ``target.shape[-2:]`` rule in NCHW).
``colout_batch`` returns ``(input, target)`` when it resized the target and the input alone otherwise, as
Composer's does. Inputs without two spatial dims (flat feature vectors) raise a ``ValueError``.

**How it plugs in.** ``batch`` slot on ``batch['input']`` (and ``batch['target']`` when resized), gathering the
kept rows and columns with ``jnp.take``. Images are NHWC by default (``data_format='NCHW'`` supported). Evaluation
sees full-size images, as in Composer.

**Functional form.** ``colout_batch(sample, p_row=0.15, p_col=0.15, resize_target='auto', *, key=None,
data_format=None)``: Composer's positional arguments (``cf.colout_batch(x, 0.2, key=key)`` for Composer's
``cf.colout_batch(x, 0.2)``), a JAX, numpy or torch array, a PIL image or an ``(input, target)`` pair of them in,
the same types out; torch tensors are NCHW by default, as Composer's, PIL images ``(H, W, C)``
(:mod:`jaxcomposer.algorithms.functional_io`). The dropped rows and columns come from the keyword-only ``key``
instead of numpy's global generator, so a call that drops anything and has no ``key`` raises.

**Reference.** No paper: created by Cory Stephenson at MosaicML (Composer's method card). Composer:
``composer/algorithms/colout``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.image_layout import model_layout, spatial_axes
from jaxcomposer.core.method import Method, MethodEntry, StepCtx

__all__ = ["colout_batch", "ColOut"]


def _check_p(name: str, p) -> float:
    if isinstance(p, bool) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"colout: {name} is the fraction of {name[2:]}s to drop and must be in [0, 1], got {p!r}.")
    return float(p)


def _check_resize_target(resize_target):
    if not isinstance(resize_target, bool) and resize_target != "auto":
        raise ValueError(f"colout: resize_target must be True, False or 'auto', got {resize_target!r}.")
    return resize_target


def _target_axes(input_ndim: int, target: jax.Array, data_format: str) -> tuple[int, int]:
    """The target's axes that line up with the input's (H, W): same offsets from the front in NHWC (masks carry no
    channel axis, or one at the end), the last two in NCHW (Composer's ``[..., rows, :]`` indexing)."""
    if data_format == "NCHW":
        return target.ndim - 2, target.ndim - 1
    return spatial_axes(input_ndim, data_format, "colout")


def _should_resize_target(input: jax.Array, target, resize_target, data_format: str) -> bool:
    """Composer's ``_should_resize_target``: a bool is taken as is; ``'auto'`` resizes a target with more than 2
    dims whose spatial size equals the input's (so ``(B,)`` labels and ``(B, C)`` one-hot rows never are)."""
    if isinstance(resize_target, bool):
        return resize_target
    if target is None or target.ndim <= 2:
        return False
    ay, ax = spatial_axes(input.ndim, data_format, "colout")
    ty, tx = _target_axes(input.ndim, target, data_format)
    return max(ty, tx) < target.ndim and (target.shape[ty], target.shape[tx]) == (input.shape[ay], input.shape[ax])


def _kept_indices(key: jax.Array, size: int, p: float) -> jax.Array:
    kept = int((1 - p) * size)  # Composer's count, in Python floats, so the static size matches it exactly
    return jnp.sort(jax.random.permutation(key, size)[:kept])


def _drop(x: jax.Array, rows: jax.Array, cols: jax.Array, axes: tuple[int, int]) -> jax.Array:
    return jnp.take(jnp.take(x, rows, axis=axes[0]), cols, axis=axes[1])


@functional_form(arrays=("sample",), pil=True)
def colout_batch(sample, p_row: float = 0.15, p_col: float = 0.15, resize_target="auto", *,
                 key: jax.Array | None = None, data_format: str | None = None):
    """Composer's ``colout_batch(sample, p_row=0.15, p_col=0.15, resize_target='auto')``: drop the same random rows
    and columns from an image ``(H, W, C)`` or a batch ``(N, H, W, C)`` (channels first with
    ``data_format='NCHW'``, the default for torch tensors) or a PIL image, and from the target when ``sample`` is an
    ``(input, target)`` pair and ``resize_target`` says so.

    The kept rows and columns are drawn from ``key`` (keyword-only), needed unless ``p_row == p_col == 0``.
    Returns the shrunk input, or ``(input, target)`` when the target was resized too (Composer's return types), in
    the caller's type (:mod:`jaxcomposer.algorithms.functional_io`).
    """
    if isinstance(sample, (tuple, list)):
        if not 1 <= len(sample) <= 2:
            raise ValueError(f"colout_batch: sample must be an array or an (input, target) pair, got {len(sample)} "
                             "items.")
        input, target = sample[0], (sample[1] if len(sample) == 2 else None)
    else:
        input, target = sample, None
    p_row, p_col = _check_p("p_row", p_row), _check_p("p_col", p_col)
    _check_resize_target(resize_target)
    if input.ndim < 3:
        raise ValueError(f"colout_batch: expected an image (3 dims) or a batch of images (4 dims), {data_format}, "
                         f"got shape {tuple(input.shape)}; flat feature vectors have no rows or columns to drop.")
    ay, ax = spatial_axes(input.ndim, data_format, "colout")
    h, w = input.shape[ay], input.shape[ax]
    if p_row > 0 or p_col > 0:
        k_row, k_col = jax.random.split(require_key(key, "colout_batch", "the rows and columns to drop"))
    else:  # nothing dropped: the sorted "permutation" is the identity whatever the key
        k_row = k_col = jax.random.key(0)
    rows, cols = _kept_indices(k_row, h, p_row), _kept_indices(k_col, w, p_col)
    out = _drop(input, rows, cols, (ay, ax))
    if target is None or not _should_resize_target(input, target, resize_target, data_format):
        return out
    ty, tx = _target_axes(input.ndim, target, data_format)
    if max(ty, tx) >= target.ndim or (target.shape[ty], target.shape[tx]) != (h, w):
        # Composer would index whatever sits there; a target of another size has no rows matching the input's.
        raise ValueError(f"colout_batch: resize_target=True needs a target with the input's spatial size {(h, w)}, "
                         f"got target shape {tuple(target.shape)} for input shape {tuple(input.shape)}.")
    return out, _drop(target, rows, cols, (ty, tx))


def ColOut(p_row: float = 0.15, p_col: float = 0.15, batch: bool = True, resize_target="auto",
           input_key: str = "input", target_key: str = "target", data_format: str | None = None) -> Method:
    """Composer's ``ColOut(p_row=0.15, p_col=0.15, batch=True, resize_target='auto')`` as a :class:`Method`
    (``batch`` slot). ``data_format=None`` follows the model's layout (NCHW for a bridged torch model, NHWC for NNX)."""
    p_row, p_col = _check_p("p_row", p_row), _check_p("p_col", p_col)
    _check_resize_target(resize_target)
    if not isinstance(batch, bool):
        raise ValueError(f"ColOut: batch must be True (one draw per batch) or False (per example), got {batch!r}.")
    if data_format is not None:
        spatial_axes(4, data_format, "colout")  # validate now, not at trace time

    def batch_fn(b: dict, ctx: StepCtx) -> dict:
        x, y, layout = b[input_key], b.get(target_key), model_layout(data_format, ctx)
        if x.ndim != 4:
            raise ValueError(f"ColOut: expected a batch of images (4 dims, {layout}) under {input_key!r}, got "
                             f"shape {tuple(x.shape)}; ColOut drops image rows and columns, so it applies to images "
                             "only.")
        resize = y is not None and _should_resize_target(x, y, resize_target, layout)
        if batch:
            out = colout_batch((x, y) if resize else x, p_row, p_col, resize, key=ctx.key, data_format=layout)
        else:
            # Per example: each image draws its own rows and columns from its own key; the kept counts are the same,
            # so the results stack. 'auto' is decided once on the batched target (Composer decides per sample).
            keys = jax.random.split(ctx.key, x.shape[0])
            if resize:
                out = jax.vmap(lambda k, xi, yi: colout_batch((xi, yi), p_row, p_col, True, key=k,
                                                              data_format=layout))(keys, x, y)
            else:
                out = jax.vmap(lambda k, xi: colout_batch(xi, p_row, p_col, False, key=k,
                                                          data_format=layout))(keys, x)
        if resize:
            return {**b, input_key: out[0], target_key: out[1]}
        return {**b, input_key: out}

    return Method(name="ColOut", batch=batch_fn,
                  description=f"ColOut(p_row={p_row}, p_col={p_col}, batch={batch}, resize_target={resize_target!r})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="colout", factory=ColOut, functional=(colout_batch,))
