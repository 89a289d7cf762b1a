"""Selective Backprop.

Method card
-----------
**What it does.** Scores every example of a batch with a gradient-free forward pass and backpropagates only
through a loss-weighted sample of ``int(keep * B)`` of them, favouring the examples the model still gets wrong.

**When it helps.** Image classification in the later part of training, once the easy examples are learned:
the backward pass (about two thirds of a step's cost) runs on ``keep * B`` examples. Composer's method card
reports training-time decreases of around 10% without loss of accuracy; the extra scoring forward eats into the
saving, which ``scale_factor < 1`` (score on downscaled images) reduces. Computer vision only (as in Composer).

**Hyperparameters** (Composer's names and defaults).

- ``start=0.5``, ``end=0.9``: active while ``start <= elapsed fraction < end``.
- ``keep=0.5``: fraction kept, in ``(0, 1]``; ``keep=1`` turns the method off (as Composer's ``match``).
- ``scale_factor=1.0``: spatial downscale of the input for the scoring pass only, in ``(0, 1]``; the kept
  examples are trained at full size.
- ``interrupt=2``: every ``interrupt``-th batch is a plain full-batch step; ``0`` never interrupts, and note
  that ``1`` interrupts every batch (the method never runs).
- ``input_key='input'``: the batch entry that ``scale_factor`` resizes.

**Exact Composer semantics.**

- ``should_selective_backprop(current_duration, batch_idx, start, end, interrupt)``:
  ``start <= t < end and (interrupt == 0 or (batch_idx + 1) % interrupt != 0)``.
- ``select_using_loss``: rank the examples by per-example loss (ascending), give rank ``r`` the weight
  ``((r + 0.5) / B) ** (1 / keep - 1)``, and draw ``int(keep * B)`` ranks without replacement with
  probabilities proportional to the weights. ``keep=0.5`` makes the weight linear in the rank; smaller ``keep``
  concentrates it on the hardest examples.
- ``scale_factor < 1``: ``F.interpolate(x, scale_factor=s, mode='linear'|'bilinear'|'trilinear',
  align_corners=False, recompute_scale_factor=False)``: output size ``floor(n * s)``, source coordinate
  ``max((i + 0.5) / s - 0.5, 0)``, no antialiasing. Inputs must be 3-, 4- or 5-D (NLC, NHWC, NDHWC here).
- The scoring forward runs **in train mode**, as in Composer (the model is in ``train()`` during the batch and
  ``torch.no_grad`` does not stop BatchNorm from updating its running statistics): dropout is on, BatchNorm
  normalizes with the scoring batch's statistics and its running statistics are updated by the scoring pass
  (on the full, possibly downscaled, batch) and then again by the backprop pass (on the kept examples). The
  reported loss is the mean loss of the kept examples, as Composer's.

**Deviations (and why).**

- Sampling without replacement is done by Gumbel-top-k, which draws exactly from "successive draws, each
  proportional to the remaining weights". Composer calls ``np.random.choice(B, n, replace=False, p=...)``, whose
  batched rejection loop gives a slightly different distribution over subsets; the per-draw weights are the same.
- At least one example is kept: ``max(1, int(keep * B))``. Composer keeps ``int(keep * B)``, which is an empty
  batch (a NaN loss) when ``keep * B < 1``.
- The interrupt counter is the clock (``ctx.step``, batches trained in the whole run), not Composer's
  ``batch_in_epoch``, so a resumed run or a skipped step (which still advances the clock) interrupts on the same
  batches as a straight run; the two agree whenever the epoch length is a multiple of ``interrupt``.
- Selection happens after the ``batch`` slots (MixUp, CutOut, ...) and scores with the composed loss (label
  smoothing, MixUp's target mixing), where Composer selects first at ``AFTER_DATALOADER`` with the model's raw
  loss. Every per-example batch entry (e.g. MixUp's permuted targets) is gathered with the kept examples, so the
  two stay consistent.

**How it plugs in.** A ``stage`` slot (``stage(batch_shapes, ctx)``, host) evaluates
``should_selective_backprop`` at ``ctx.progress`` and ``ctx.step``, so the kept batch has a static size: one
compile for "selecting" steps and one for plain steps. A ``grad`` slot scores the batch with
``ctx.model.per_example_loss`` (the step's own forward at its precision and composed loss), gathers the kept
examples from every batch entry and calls the inner ``grad_fn`` on them. The method declares ``order=-1``, so it
sorts first (outermost) wherever it is listed, like Composer's ``sort_selective_backprop_first``: other grad
wrappers (SAM) see the pruned batch. With gradient accumulation the kept count must divide by the number of
microbatches. See docs/design.md, "Methods and slots" and "The clock".

**Functional form.** ``select_using_loss(input, target, model, loss_fun, keep=0.5, scale_factor=1.0, *, key=None,
data_format=None)``: Composer's positional arguments, JAX, numpy or torch arrays in, the same type out
(:mod:`jaxcomposer.algorithms.functional_io`). With torch tensors, ``model`` and ``loss_fun`` are the caller's torch
callables, run under ``torch.no_grad()`` on NCHW tensors (the default layout for torch). As in Composer, ``loss_fun``
is called with ``reduction='none'`` and must take that keyword (a ``TypeError`` otherwise, whatever ``keep``), and
a ``scale_factor`` below 1 needs a 3-, 4- or 5-D input even when ``keep`` keeps everything. The draw comes from the
keyword-only ``key`` (Composer: numpy's global generator), needed unless ``keep`` keeps the whole batch.

**Reference.** Jiang et al., "Accelerating Deep Learning by Focusing on the Biggest Losers", 2019
(arXiv:1910.00762). Composer: ``composer/algorithms/selective_backprop``.
"""
from __future__ import annotations

import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxcomposer.algorithms.functional_io import functional_form, require_key
from jaxcomposer.algorithms.image_layout import model_layout
from jaxcomposer.core.method import Method, MethodEntry, StepCtx, require_stage

__all__ = ["should_selective_backprop", "select_using_loss", "SelectiveBackprop"]

_DATA_FORMATS = ("NHWC", "NCHW")


def should_selective_backprop(current_duration: float, batch_idx: int, start: float = 0.5, end: float = 0.9,
                              interrupt: int = 2) -> bool:
    """Composer's ``should_selective_backprop``: a host-side Python decision (it picks a static batch size)."""
    is_interval = start <= current_duration < end
    is_step = interrupt == 0 or (batch_idx + 1) % interrupt != 0
    return is_interval and is_step


def _check_keep(keep: float, who: str) -> None:
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"{who}: keep is the fraction of the batch to backpropagate and must be in (0, 1], "
                         f"got {keep}.")


def _check_scale(scale_factor: float, who: str) -> None:
    if not 0.0 < scale_factor <= 1.0:
        raise ValueError(f"{who}: scale_factor downsamples the scoring pass and must be in (0, 1], "
                         f"got {scale_factor}.")


def _check_format(data_format: str, who: str) -> None:
    if data_format not in _DATA_FORMATS:
        raise ValueError(f"{who}: data_format must be one of {_DATA_FORMATS}, got {data_format!r}.")


def _num_selected(batch_size: int, keep: float) -> int:
    return max(1, int(keep * batch_size))


def _linear_resize_axis(x: jax.Array, axis: int, scale_factor: float) -> jax.Array:
    """torch's linear interpolation along one axis, ``align_corners=False`` with the scale given (not recomputed
    from the sizes): gathers at static indices, so it is jit-friendly."""
    n_in = x.shape[axis]
    n_out = math.floor(n_in * scale_factor)
    if n_out < 1:
        raise ValueError(f"selective backprop: scale_factor={scale_factor} shrinks an axis of size {n_in} to "
                         f"{n_out}; use a larger scale_factor.")
    src = np.maximum((np.arange(n_out) + 0.5) / scale_factor - 0.5, 0.0)
    i0 = np.minimum(np.floor(src).astype(np.int32), n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    shape = [1] * x.ndim
    shape[axis] = n_out
    w1 = jnp.asarray((src - i0).reshape(shape), x.dtype)
    return jnp.take(x, i0, axis=axis) * (1 - w1) + jnp.take(x, i1, axis=axis) * w1


def _downscale(x: jax.Array, scale_factor: float, data_format: str) -> jax.Array:
    """Composer's ``F.interpolate(..., mode='linear'/'bilinear'/'trilinear')`` on 3-, 4- or 5-D inputs."""
    if x.ndim not in (3, 4, 5):
        raise ValueError(f"selective backprop: input must be 3D, 4D, or 5D if scale_factor != 1, got {x.ndim}D "
                         f"(shape {x.shape}).")
    if not jnp.issubdtype(x.dtype, jnp.floating):  # integer images cannot hold interpolated values
        x = x.astype(jnp.float32)
    spatial = range(1, x.ndim - 1) if data_format == "NHWC" else range(2, x.ndim)
    for axis in spatial:
        x = _linear_resize_axis(x, axis, scale_factor)
    return x


def _selection_indices(losses: jax.Array, key: jax.Array, keep: float) -> jax.Array:
    """Sorted indices of ``max(1, int(keep * B))`` examples drawn without replacement with probability
    proportional to ``((loss rank + 0.5) / B) ** (1 / keep - 1)`` (Gumbel-top-k: successive sampling)."""
    if losses.ndim != 1:
        raise ValueError(f"selective backprop: the loss must return one value per example, shape (B,); got "
                         f"shape {losses.shape}.")
    n = losses.shape[0]
    ascending = jnp.argsort(losses)  # rank 0 = smallest loss, as Composer's torch.argsort
    # log of Composer's unnormalized probabilities; normalization does not change the top-k of log p + Gumbel
    log_weights = (1.0 / keep - 1.0) * np.log((np.arange(n) + 0.5) / n)
    scores = jnp.asarray(log_weights, jnp.float32) + jax.random.gumbel(key, (n,), jnp.float32)
    _, ranks = jax.lax.top_k(scores, _num_selected(n, keep))
    # batch order, so microbatch splits and gathers do not depend on the draw order
    return jnp.sort(ascending[ranks])


def _check_loss_fun(loss_fun: Callable) -> None:
    """Composer's check: ``loss_fun`` is called with ``reduction='none'``, so it must name that parameter (a
    ``**kwargs`` catch-all does not count, as in Composer)."""
    if not callable(loss_fun):
        raise TypeError(f"select_using_loss: Loss function must be callable, got {type(loss_fun).__name__}.")
    try:
        takes_reduction = "reduction" in inspect.signature(loss_fun).parameters
    except (TypeError, ValueError):  # builtins without a signature cannot show it
        takes_reduction = False
    if not takes_reduction:
        raise TypeError("select_using_loss: Loss function `loss_fun` must take a keyword argument `reduction`. It is "
                        "called as loss_fun(outputs, target, reduction='none') and must return one loss per "
                        "example; wrap a JAX loss such as soft_cross_entropy as "
                        "lambda out, y, reduction='none': soft_cross_entropy(out, y).")


@functional_form(arrays=("input", "target"), callables=("model", "loss_fun"))
def select_using_loss(input: jax.Array, target: jax.Array, model: Callable[[jax.Array], jax.Array],
                      loss_fun: Callable[[jax.Array, jax.Array], jax.Array], keep: float = 0.5,
                      scale_factor: float = 1.0, *, key: jax.Array | None = None,
                      data_format: str | None = None) -> tuple[jax.Array, jax.Array]:
    """Composer's ``select_using_loss(input, target, model, loss_fun, keep=0.5, scale_factor=1)``: returns
    ``(input[idx], target[idx])``, the examples kept in batch order.

    ``model(x) -> outputs``; ``loss_fun(outputs, target, reduction='none')`` returns ``(B,)`` per-example losses:
    as Composer's, ``loss_fun`` must take the ``reduction`` keyword, or a ``TypeError`` is raised (torch's
    ``F.cross_entropy`` does; wrap a JAX loss as ``lambda out, y, reduction='none': soft_cross_entropy(out, y)``).
    The scoring pass sees ``input`` downscaled by ``scale_factor`` (spatial axes per ``data_format``; NCHW by
    default for torch tensors), which needs a 3-, 4- or 5-D ``input``; its losses carry no gradient. These checks
    run on every call, as Composer's. The draw comes from ``key`` (keyword-only), needed unless ``keep`` keeps the
    whole batch; such a call returns the batch as given, in batch order, without scoring it (Composer scores it
    and returns a random permutation of it). With torch tensors, ``model`` and ``loss_fun`` are the caller's torch
    callables, run under ``torch.no_grad()`` (:mod:`jaxcomposer.algorithms.functional_io`).
    """
    _check_keep(keep, "select_using_loss")
    _check_scale(scale_factor, "select_using_loss")
    _check_format(data_format, "select_using_loss")
    _check_loss_fun(loss_fun)
    if scale_factor < 1 and input.ndim not in (3, 4, 5):
        raise ValueError(f"select_using_loss: input must be 3D, 4D, or 5D if scale_factor != 1, got {input.ndim}D "
                         f"(shape {input.shape}).")
    if _num_selected(input.shape[0], keep) < input.shape[0]:
        key = require_key(key, "select_using_loss", "which examples to keep, with probability by loss rank")
    else:  # every example is kept, in batch order: no draw
        return input, target
    scaled = _downscale(input, scale_factor, data_format) if scale_factor < 1 else input
    losses = jax.lax.stop_gradient(loss_fun(model(scaled), target, reduction="none"))
    idx = _selection_indices(losses, key, keep)
    return input[idx], target[idx]


def _take_examples(batch: dict, idx: jax.Array, batch_size: int) -> dict:
    def take(path, x):
        if jnp.ndim(x) == 0 or x.shape[0] != batch_size:
            raise ValueError(f"SelectiveBackprop: every batch entry must be per-example (leading axis "
                             f"{batch_size}); {jax.tree_util.keystr(path)} has shape {jnp.shape(x)}.")
        return x[idx]

    return jax.tree_util.tree_map_with_path(take, batch)


def SelectiveBackprop(start: float = 0.5, end: float = 0.9, keep: float = 0.5, scale_factor: float = 1.0,
                      interrupt: int = 2, input_key: str = "input", data_format: str | None = None) -> Method:
    """Composer's ``SelectiveBackprop(start=0.5, end=0.9, keep=0.5, scale_factor=1., interrupt=2)`` as a
    :class:`Method` (``stage`` + ``grad`` slots). ``data_format=None`` (where ``scale_factor`` downscales) follows
    the model's layout (NCHW for a bridged torch model, NHWC for NNX)."""
    start, end, keep, scale_factor = float(start), float(end), float(keep), float(scale_factor)
    if not 0.0 <= start <= end <= 1.0:
        raise ValueError(f"SelectiveBackprop: start and end are fractions of training with "
                         f"0 <= start <= end <= 1, got start={start}, end={end}.")
    _check_keep(keep, "SelectiveBackprop")
    _check_scale(scale_factor, "SelectiveBackprop")
    if data_format is not None:
        _check_format(data_format, "SelectiveBackprop")
    if isinstance(interrupt, bool) or int(interrupt) != interrupt or interrupt < 0:
        raise ValueError(f"SelectiveBackprop: interrupt must be a non-negative integer (0: never interrupt), "
                         f"got {interrupt!r}.")
    interrupt = int(interrupt)

    def stage(batch_shapes, ctx: StepCtx) -> bool:
        # keep == 1 would select everything: Composer's match() skips the method then, and so do we
        step = int(ctx.step)
        return keep < 1 and should_selective_backprop(step / max(ctx.run.total_steps, 1), step, start, end,
                                                      interrupt)

    def wrap(grad_fn: Callable, ctx: StepCtx) -> Callable:
        selects = require_stage(ctx, "SelectiveBackprop", "this method's stage slot decides (statically) whether "
                                "a step selects; pass composed.stage(batch_shapes, ctx) to the step, as the Trainer "
                                "does.")
        if not selects:
            return grad_fn
        per_example_loss = ctx.model.per_example_loss
        if per_example_loss is None:
            raise ValueError("SelectiveBackprop: needs ctx.model.per_example_loss (the step's forward and "
                             "per-example loss) to score examples; the Trainer's train step provides it.")

        def selective(params, model_state, batch, key):
            k_score, k_select = jax.random.split(ctx.key)
            x = batch[input_key]
            scored = {**batch, input_key: _downscale(x, scale_factor, model_layout(data_format, ctx))} \
                if scale_factor < 1 else batch
            # Train mode, and its model-state update is kept: Composer's scoring forward runs the model in
            # train() under no_grad, which still updates BatchNorm's running statistics.
            losses, model_state = per_example_loss(params, model_state, scored, k_score)
            idx = _selection_indices(jax.lax.stop_gradient(losses), k_select, keep)
            return grad_fn(params, model_state, _take_examples(batch, idx, x.shape[0]), key)

        return selective

    return Method(name="SelectiveBackprop", stage=stage, grad=wrap, order=-1,
                  description=f"SelectiveBackprop(start={start}, end={end}, keep={keep}, "
                              f"scale_factor={scale_factor}, interrupt={interrupt})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="selective_backprop", factory=SelectiveBackprop, functional=(select_using_loss, should_selective_backprop))
