"""RandAugment.

Method card
-----------
**What it does.** Applies ``depth`` random image operations at strength up to ``severity`` to every training image,
on the host. Each operation is drawn uniformly (with replacement) from an augmentation set: autocontrast, equalize,
posterize, rotate, solarize, shear, translate and (set ``'all'``) color, contrast, brightness, sharpness. As in
Composer (unlike the paper's fixed magnitude ``M``), each operation draws its strength uniformly up to ``severity``.

**When it helps.** Image classification trained long enough to overfit: Composer measured a 1.3x time-to-accuracy
speedup on ResNet-101/ImageNet and uses it in its "hot" ResNet-50 recipe (``depth=1``). Like any strong
augmentation it slows convergence on short schedules. It costs host CPU, mostly PIL's per-call Python overhead,
which the Trainer overlaps with the device step (two batches are prefetched; benchmarks/README.md, "Measurements
behind code choices").

**Hyperparameters.** ``severity`` (default ``9``, in ``[0, 10]``: the paper's ``M``); ``depth`` (default ``2``, the
paper's ``N``); ``augmentation_set`` (default ``'all'``; ``'safe'`` leaves out the operations that overlap
ImageNet-C / CIFAR-10-C corruptions, ``'original'`` uses the AugMix repository's enhancement operations; see
:mod:`jaxcomposer.algorithms.augmentation_primitives`). jaxcomposer's additions: ``input_key``, ``data_format`` and
``mean``/``std``, the normalization float images carry (``x = (pixel / 255 - mean) / std``): the operations need
pixels, so normalized images are mapped back to uint8, augmented and normalized again. Without ``mean``/``std``
float images must lie in ``[0, 1]``; uint8 images are used as they are.

**How it plugs in.** ``data`` slot, ``data(batch, ctx) -> batch`` (docs/design.md, "Methods and slots"): runs on the
host on each numpy training batch before it goes to the device (Composer inserts a per-sample transform into the
torchvision dataset instead). Each image gets its own child of the batch's generator ``ctx.key``, which the Trainer
seeds from (run seed, epoch, batch, method name): runs are reproducible and a resumed run augments exactly as the
uninterrupted one did. Evaluation batches are never augmented. Nothing changes inside the jitted step, so it
composes with every in-jit method.

**Reference.** Cubuk et al., "RandAugment: Practical automated data augmentation with a reduced search space",
CVPR workshops 2020 (arXiv:1909.13719). Composer: ``composer/algorithms/randaugment``.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np
from PIL import Image

from jaxcomposer.algorithms.augmentation_primitives import (AugmentationFn, describe_augmentation_set,
                                                            image_data_fn, map_images, resolve_augmentation_set,
                                                            validate_normalization)
from jaxcomposer.algorithms.functional_io import functional_form
from jaxcomposer.core.method import Method, MethodEntry

__all__ = ["randaugment_image", "RandAugment"]


def check_severity(severity, where: str) -> float:
    if isinstance(severity, bool) or not isinstance(severity, numbers.Real) or not 0 <= severity <= 10:
        raise ValueError(f"{where}: severity must be a number in [0, 10], got {severity!r}.")
    return float(severity)


def _check_depth(depth, where: str) -> int:
    if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 0:
        raise ValueError(f"{where}: depth must be an integer >= 0 (the number of operations per image), "
                         f"got {depth!r}.")
    return int(depth)


def _randaugment_pil(img: Image.Image, rng: np.random.Generator, severity: float, depth: int,
                     ops: list[AugmentationFn]) -> Image.Image:
    for _ in range(depth):
        img = ops[rng.integers(len(ops))](img, severity, rng)
    return img


@functional_form(arrays=("img",), host=True)
def randaugment_image(img: Any, severity: float = 9, depth: int = 2,
                      augmentation_set: str | Sequence[AugmentationFn] = "all", *, rng: Any = None,
                      data_format: str | None = None, mean=None, std=None) -> Any:
    """Composer's ``randaugment_image`` with explicit randomness: ``rng`` is a ``numpy.random.Generator``, an int
    seed or a JAX PRNG key.

    ``img`` is a PIL image (returned as a PIL image) or an array: one image ``(H, W)`` / ``(H, W, C)`` or a batch
    ``(N, H, W, C)`` (``NCHW`` with ``data_format='NCHW'``), ``C`` in {1, 3}, of uint8 pixels, floats in ``[0, 1]``,
    or floats normalized with ``mean``/``std``; the result has the input's shape, dtype and value range. Image ``i``
    of a batch uses ``rng.spawn(N)[i]``.
    """
    where = "randaugment_image"
    severity, depth = check_severity(severity, where), _check_depth(depth, where)
    ops = resolve_augmentation_set(augmentation_set, where)
    return map_images(lambda im, g: _randaugment_pil(im, g, severity, depth, ops), img, rng,
                      data_format=data_format, mean=mean, std=std, where=where)


def RandAugment(severity: float = 9, depth: int = 2, augmentation_set: str = "all", input_key: str = "input",
                data_format: str | None = None, mean=None, std=None) -> Method:
    """Composer's ``RandAugment(severity=9, depth=2, augmentation_set='all')`` as a :class:`Method` (``data``)."""
    where = "RandAugment"
    severity, depth = check_severity(severity, where), _check_depth(depth, where)
    ops = resolve_augmentation_set(augmentation_set, where)
    validate_normalization(mean, std, where)
    if data_format not in (None, "NHWC", "NCHW"):  # None: the model's layout (NCHW for a torch model)
        raise ValueError(f"{where}: data_format must be 'NHWC' or 'NCHW' (or None), got {data_format!r}.")
    data_fn = image_data_fn(where, lambda im, g: _randaugment_pil(im, g, severity, depth, ops), input_key,
                            data_format, mean, std)
    label = describe_augmentation_set(augmentation_set)
    return Method(name="RandAugment", data=data_fn,
                  description=f"RandAugment(severity={severity:g}, depth={depth}, augmentation_set={label})")


# Registration: jaxcomposer.algorithms, jaxcomposer.functional and `jaxcomposer methods` find the method here.
ENTRY = MethodEntry(registry_name="randaugment", factory=RandAugment, functional=(randaugment_image,))
