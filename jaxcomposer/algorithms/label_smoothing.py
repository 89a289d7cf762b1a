"""Label smoothing.

Method card
-----------
**What it does.** Replaces hard targets with ``onehot(y) * (1 - smoothing) + smoothing / C`` before the loss, so the
model is pushed towards confident-but-not-infinite logits (C = number of classes: the logits' class axis, the last
for JAX models and axis 1 for torch models and tensors, as Composer's).

**When it helps.** Image classification with cross-entropy (ResNets on ImageNet/CIFAR: +0.1-0.5% top-1 at no cost).
It changes the loss value (it no longer goes to 0), so compare runs by accuracy, not by training loss. Rarely useful
for language models.

**Hyperparameters.** ``smoothing`` (default ``0.1``; Composer recipes use ``0.08``-``0.1``): the probability mass
moved from the true class to the uniform distribution, in ``[0, 1]`` as Composer documents it (``1`` ignores the
targets: every class gets ``1 / C``). Composer does not check the range; values outside it are refused here.

**Exact Composer semantics.** Index or dense targets are told apart by shape, as Composer's
``infer_target_type``: a target with the logits' shape is dense (one-hot or soft, integer dtype included, so
integer one-hot rows are smoothed, not encoded again); a target with one dimension fewer holds class indices;
anything else raises.

**Functional form.** ``smooth_labels(logits, target, smoothing=0.1, *, data_format=None)``: Composer's positional
arguments, and numpy, JAX or torch arrays in, the same type out (:mod:`jaxcomposer.algorithms.functional_io`). The
class axis is the last one for JAX and numpy arrays (our layout) and axis 1 for torch tensors (Composer's);
``data_format='NCHW'`` / ``'NHWC'`` chooses it explicitly. The two agree for ``(N, C)`` logits.

**How it plugs in.** A ``loss`` slot wrapper, ``loss(loss_fn, ctx) -> loss_fn`` (docs/design.md, "Methods and
slots"): the target under ``target_key`` is replaced by the smoothed dense targets for the call to the inner
per-example loss (Composer's ``BEFORE_LOSS``/``AFTER_LOSS`` pair: the batch the rest of the step sees is untouched,
which in a pure step is automatic). The inner loss must accept dense targets
(``soft_cross_entropy`` does). The class axis follows the model's layout, read from ``ctx.model.param_layout``: a
bridged torch model keeps torch's NCHW outputs, so its ``(N, C, H, W)`` logits are smoothed along axis 1 (the
dense targets a torch ``F.cross_entropy`` takes, as Composer's ``ensure_targets_one_hot`` makes them); a JAX/NNX
model's along the last axis (NHWC). The two agree for ``(N, C)`` logits.

**Reference.** Szegedy et al., "Rethinking the Inception Architecture for Computer Vision", CVPR 2016
(arXiv:1512.00567). Composer: ``composer/algorithms/label_smoothing``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry, StepCtx

__all__ = ["smooth_labels", "LabelSmoothing"]


def _class_axis(ndim: int, data_format: str) -> int:
    if data_format == "NHWC":
        return ndim - 1
    if data_format == "NCHW":
        return min(1, ndim - 1)
    raise ValueError(f"smooth_labels: data_format must be 'NHWC' (classes on the last axis) or 'NCHW' (classes on "
                     f"axis 1), got {data_format!r}.")


def check_smoothing(smoothing, where: str) -> float:
    if isinstance(smoothing, bool) or not 0.0 <= float(smoothing) <= 1.0:
        raise ValueError(f"{where}: smoothing is the probability mass moved to the uniform distribution and must be "
                         f"in [0, 1], got {smoothing!r}.")
    return float(smoothing)


@functional_form(arrays=("logits", "target"))
def smooth_labels(logits: jax.Array, target: jax.Array, smoothing: float = 0.1, *,
                  data_format: str | None = None) -> jax.Array:
    """Composer's ``smooth_labels(logits, target, smoothing=0.1)``: dense float targets
    ``onehot * (1 - smoothing) + smoothing / C``.

    As Composer decides (``infer_target_type``): a ``target`` of ``logits``' shape is already dense (one-hot or
    soft, whatever its dtype, so integer one-hot rows are not encoded again); one of one dimension fewer holds class
    indices. ``C`` is the class axis of ``logits``: the last (``data_format='NHWC'``, our layout) or axis 1
    (``'NCHW'``, Composer's torch layout, the default for torch tensors); the two agree for ``(N, C)`` logits.
    """
    if isinstance(smoothing, (int, float)):  # a traced smoothing (jit over it) is the caller's to check
        smoothing = check_smoothing(smoothing, "smooth_labels")
    axis = _class_axis(logits.ndim, data_format)
    n_classes = logits.shape[axis]
    if target.shape == logits.shape:
        targets = target.astype(jnp.float32)
    elif target.ndim == logits.ndim - 1:
        targets = jax.nn.one_hot(target, n_classes, dtype=jnp.float32, axis=axis)
    else:
        raise ValueError(f"smooth_labels: target of shape {tuple(target.shape)} is neither dense (the logits' shape "
                         f"{tuple(logits.shape)}) nor class indices (one dimension fewer than the logits).")
    return targets * (1.0 - smoothing) + smoothing / n_classes


def LabelSmoothing(smoothing: float = 0.1, target_key: str = "target") -> Method:
    """Composer's ``LabelSmoothing(smoothing=0.1)`` as a :class:`Method` with a ``loss`` slot."""
    smoothing = check_smoothing(smoothing, "LabelSmoothing")

    def wrap(loss_fn: Callable, ctx: StepCtx) -> Callable:
        # a bridged torch model's outputs keep torch's layout (classes on axis 1); the outputs' own type cannot
        # tell, since inside the step they are JAX arrays either way
        data_format = "NCHW" if ctx.model.param_layout == "torch" else "NHWC"

        def smoothed_loss(outputs, batch):
            # A new dict, never an edit: the caller's batch (and so metrics) keeps the original labels.
            smoothed = smooth_labels(outputs, batch[target_key], smoothing, data_format=data_format)
            return loss_fn(outputs, {**batch, target_key: smoothed})

        return smoothed_loss

    return Method(name="LabelSmoothing", loss=wrap, description=f"LabelSmoothing(smoothing={smoothing})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="label_smoothing", factory=LabelSmoothing, functional=(smooth_labels,))
