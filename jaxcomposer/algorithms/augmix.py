"""AugMix.

Method card
-----------
**What it does.** Replaces every training image by a random convex mix of itself and ``width`` augmented versions,
on the host. Each version is a chain of ``depth`` random operations (``-1``: 1 to 3, drawn per chain) from an
augmentation set at strength up to ``severity``; the versions are combined with ``Dirichlet(alpha)`` weights, then
mixed with the original by ``m ~ Beta(alpha, alpha)``: ``(1 - m) * original + m * combination``.

**When it helps.** Robustness to distribution shift and calibration (the paper: ImageNet-C and CIFAR-10-C error
down sharply at equal clean accuracy); on clean accuracy it is a regularizer like RandAugment, useful on long
schedules only. It runs ``width`` chains per image, so it costs about three times RandAugment's host time, which
can bound the throughput of a small model on a few CPU cores (benchmarks/README.md, "Measurements behind code
choices").

**Hyperparameters.** ``severity`` (default ``3``, in ``[0, 10]``); ``depth`` (default ``-1``: a random chain length
in 1..3; else a fixed length >= 1); ``width`` (default ``3`` chains); ``alpha`` (default ``1.0``, > 0: the
pseudocount of the Dirichlet and Beta draws; small values make one chain and one side of the final mix dominate);
``augmentation_set`` (default ``'all'``, or ``'safe'`` / ``'original'``, see
:mod:`jaxcomposer.algorithms.augmentation_primitives`; use ``'safe'`` when you report ImageNet-C / CIFAR-10-C
numbers). jaxcomposer's additions: ``input_key``, ``data_format`` and ``mean``/``std`` (as in RandAugment: the
normalization float images carry, undone before and redone after the operations).

**Differences from the paper and from Composer.** As in Composer there is no Jensen-Shannon consistency loss (the
paper's second half): this is the augmentation only. Composer also accepts ``depth`` of 0 or below -1 (both mean
"random 1..3"); here only ``-1`` means random and other values below 1 are an error, because ``depth=0`` reads as
"no operations".

**How it plugs in.** ``data`` slot, ``data(batch, ctx) -> batch`` (docs/design.md, "Methods and slots"): runs on the
host on each numpy training batch before it goes to the device (Composer inserts a per-sample transform into the
torchvision dataset instead). Each image gets its own child of the batch's generator ``ctx.key``, which the Trainer
seeds from (run seed, epoch, batch, method name): runs are reproducible and a resumed run augments exactly as the
uninterrupted one did. Evaluation batches are never augmented. Nothing changes inside the jitted step, so it
composes with every in-jit method.

**Reference.** Hendrycks et al., "AugMix: A Simple Data Processing Method to Improve Robustness and Uncertainty",
ICLR 2020 (arXiv:1912.02781). Composer: ``composer/algorithms/augmix``.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np
from PIL import Image

from jaxcomposer.algorithms.augmentation_primitives import (AugmentationFn, describe_augmentation_set,
                                                            image_data_fn, map_images, resolve_augmentation_set,
                                                            validate_normalization)
from jaxcomposer.algorithms.randaugment import check_severity
from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["augmix_image", "AugMix"]


def _check_args(depth, width, alpha, where: str) -> tuple[int, int, float]:
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or not (depth == -1 or depth >= 1):
        raise ValueError(f"{where}: depth must be -1 (a random chain length in 1..3) or an integer >= 1, "
                         f"got {depth!r}.")
    if isinstance(width, bool) or not isinstance(width, numbers.Integral) or width < 1:
        raise ValueError(f"{where}: width must be an integer >= 1 (the number of augmentation chains), got {width!r}.")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"{where}: alpha must be a finite number > 0 (the Dirichlet/Beta pseudocount), "
                         f"got {alpha!r}.")
    return int(depth), int(width), float(alpha)


def _augmix_pil(img: Image.Image, rng: np.random.Generator, severity: float, depth: int, width: int, alpha: float,
                ops: list[AugmentationFn]) -> Image.Image:
    # Composer's draw order (weights, mixing coefficient, then chain by chain) and float32 arithmetic.
    chain_weights = rng.dirichlet([alpha] * width).astype(np.float32)
    mixing_weight = np.float32(rng.beta(alpha, alpha))
    original = np.asarray(img)
    combination = np.zeros(original.shape, np.float32)
    for weight in chain_weights:
        augmented = img  # PIL operations return new images, so the original is never modified
        for _ in range(depth if depth > 0 else int(rng.integers(1, 4))):
            augmented = ops[rng.integers(len(ops))](augmented, severity, rng)
        combination += weight * np.asarray(augmented)
    mixed = (1 - mixing_weight) * original + mixing_weight * combination
    # Composer's np.uint8(mixed) truncates; the clip only guards float32 round-off past 255.
    return Image.fromarray(np.clip(mixed, 0, 255).astype(np.uint8))


@functional_form(arrays=("img",), host=True)
def augmix_image(img: Any, severity: float = 3, depth: int = -1, width: int = 3, alpha: float = 1.0,
                 augmentation_set: str | Sequence[AugmentationFn] = "all", *, rng: Any = None,
                 data_format: str | None = None, mean=None, std=None) -> Any:
    """Composer's ``augmix_image`` with explicit randomness: ``rng`` is a ``numpy.random.Generator``, an int seed or
    a JAX PRNG key.

    ``img`` is a PIL image (returned as a PIL image) or an array: one image ``(H, W)`` / ``(H, W, C)`` or a batch
    ``(N, H, W, C)`` (``NCHW`` with ``data_format='NCHW'``), ``C`` in {1, 3}, of uint8 pixels, floats in ``[0, 1]``,
    or floats normalized with ``mean``/``std``; the result has the input's shape, dtype and value range. Image ``i``
    of a batch uses ``rng.spawn(N)[i]``.
    """
    where = "augmix_image"
    severity = check_severity(severity, where)
    depth, width, alpha = _check_args(depth, width, alpha, where)
    ops = resolve_augmentation_set(augmentation_set, where)
    return map_images(lambda im, g: _augmix_pil(im, g, severity, depth, width, alpha, ops), img, rng,
                      data_format=data_format, mean=mean, std=std, where=where)


def AugMix(severity: float = 3, depth: int = -1, width: int = 3, alpha: float = 1.0, augmentation_set: str = "all",
           input_key: str = "input", data_format: str | None = None, mean=None, std=None) -> Method:
    """Composer's ``AugMix(severity=3, depth=-1, width=3, alpha=1.0, augmentation_set='all')`` as a
    :class:`Method` (``data`` slot)."""
    where = "AugMix"
    severity = check_severity(severity, where)
    depth, width, alpha = _check_args(depth, width, alpha, where)
    ops = resolve_augmentation_set(augmentation_set, where)
    validate_normalization(mean, std, where)
    if data_format not in (None, "NHWC", "NCHW"):  # None: the model's layout (NCHW for a torch model)
        raise ValueError(f"{where}: data_format must be 'NHWC' or 'NCHW' (or None), got {data_format!r}.")
    data_fn = image_data_fn(where, lambda im, g: _augmix_pil(im, g, severity, depth, width, alpha, ops), input_key,
                            data_format, mean, std)
    return Method(name="AugMix", data=data_fn,
                  description=(f"AugMix(severity={severity:g}, depth={depth}, width={width}, alpha={alpha:g}, "
                               f"augmentation_set={describe_augmentation_set(augmentation_set)})"))


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="augmix", factory=AugMix, functional=(augmix_image,))
