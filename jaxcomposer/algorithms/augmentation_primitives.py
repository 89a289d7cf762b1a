"""The PIL image operations RandAugment and AugMix draw from, and the host-side plumbing they share.

The thirteen operations and the three sets are Composer's ``composer/algorithms/utils/augmentation_primitives.py``
(itself adapted from the AugMix authors' ``augmentations.py``), with the same level -> magnitude mappings: a
severity ``level`` in ``[0, 10]`` is the upper end of a uniform draw ``U(0.1, level)`` that scales each operation's
maximum (posterize 4 bits, rotate 30 degrees, solarize 256, shear 0.3, translate a third of the image side); the
enhancement operations of ``'all'`` use Composer's symmetric draw around 1, those of ``'original'`` the AugMix
repository's ``0.1 + 1.8 * U(0.1, level) / 10``.

The one change is the randomness: each operation takes an explicit ``numpy.random.Generator`` instead of reading
NumPy's global state, so a run is reproducible and a resumed run augments exactly as the uninterrupted one did.

``augmentation_sets``:

* ``'all'``: every operation below (Composer's enhancement operations);
* ``'safe'``: without ``color``, ``contrast``, ``brightness`` and ``sharpness``, which overlap the corruptions of
  the ImageNet-C / CIFAR-10-C robustness test sets;
* ``'original'``: like ``'all'`` with the AugMix repository's ``*_original`` enhancement operations.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from jaxcomposer.algorithms.image_layout import model_layout

if TYPE_CHECKING:  # annotations only: the host-side augmentation itself needs no JAX
    from jaxcomposer.core.method import StepCtx

__all__ = [
    "AugmentationFn", "augmentation_sets", "autocontrast", "equalize", "posterize", "rotate", "solarize", "shear_x",
    "shear_y", "translate_x", "translate_y", "color", "color_original", "contrast", "contrast_original",
    "brightness", "brightness_original", "sharpness", "sharpness_original", "as_generator", "resolve_augmentation_set",
    "map_images", "validate_normalization", "image_data_fn", "describe_augmentation_set",
]

# (image, level in [0, 10], rng) -> image
AugmentationFn = Callable[[Image.Image, float, np.random.Generator], Image.Image]


def _int_parameter(level: float, maxval: float) -> int:
    return int(level * maxval / 10)


def _float_parameter(level: float, maxval: float) -> float:
    return float(level) * maxval / 10.0


def _sample_level(n: float, rng: np.random.Generator) -> float:
    # Composer's np.random.uniform(low=0.1, high=n). NumPy's legacy uniform computes low + (high - low) * U even when
    # high < low (severity 0 gives levels in (0, 0.1]); Generator.uniform refuses that, so spell the formula out.
    return 0.1 + (float(n) - 0.1) * rng.random()


def _symmetric_sample(level: float, rng: np.random.Generator) -> float:
    """Half the time ``U(1, level)`` (strengthen), half the time ``U(1 - 0.09 * level, 1)`` (weaken): an enhancement
    factor whose median is 1 (no change), as Composer samples it."""
    if rng.random() > 0.5:
        return 1.0 + (float(level) - 1.0) * rng.random()
    low = 1.0 - 0.09 * float(level)
    return low + (1.0 - low) * rng.random()


def _sign(rng: np.random.Generator) -> int:
    return -1 if rng.random() > 0.5 else 1


def autocontrast(pil_img: Image.Image, level: float = 0.0, rng: np.random.Generator | None = None) -> Image.Image:
    """:func:`PIL.ImageOps.autocontrast`: stretch the intensity range to ``[0, 255]``; ``level`` is unused."""
    del level, rng
    return ImageOps.autocontrast(pil_img)


def equalize(pil_img: Image.Image, level: float = 0.0, rng: np.random.Generator | None = None) -> Image.Image:
    """:func:`PIL.ImageOps.equalize`: flatten the intensity histogram; ``level`` is unused."""
    del level, rng
    return ImageOps.equalize(pil_img)


def posterize(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Keep ``4 - int(U(0.1, level) * 4 / 10)`` bits per channel (so 4 bits even at level 0, as in Composer)."""
    return ImageOps.posterize(pil_img, 4 - _int_parameter(_sample_level(level, rng), 4))


def rotate(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Rotate by ``+-int(U(0.1, level) * 3)`` degrees (bilinear, black fill)."""
    degrees = _int_parameter(_sample_level(level, rng), 30) * _sign(rng)
    return pil_img.rotate(degrees, resample=Image.Resampling.BILINEAR)


def solarize(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Invert pixels at or above ``256 - int(U(0.1, level) * 25.6)``."""
    return ImageOps.solarize(pil_img, 256 - _int_parameter(_sample_level(level, rng), 256))


def _affine(pil_img: Image.Image, coeffs: tuple) -> Image.Image:
    return pil_img.transform(pil_img.size, Image.Transform.AFFINE, coeffs, resample=Image.Resampling.BILINEAR)


def shear_x(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Horizontal shear by ``+-U(0.1, level) * 0.03`` (bilinear)."""
    s = _float_parameter(_sample_level(level, rng), 0.3) * _sign(rng)
    return _affine(pil_img, (1, s, 0, 0, 1, 0))


def shear_y(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Vertical shear by ``+-U(0.1, level) * 0.03`` (bilinear)."""
    s = _float_parameter(_sample_level(level, rng), 0.3) * _sign(rng)
    return _affine(pil_img, (1, 0, 0, s, 1, 0))


def translate_x(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Horizontal shift by ``+-int(U(0.1, level) * width / 30)`` pixels (black fill)."""
    t = _int_parameter(_sample_level(level, rng), pil_img.size[0] / 3) * _sign(rng)
    return _affine(pil_img, (1, 0, t, 0, 1, 0))


def translate_y(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """Vertical shift by ``+-int(U(0.1, level) * height / 30)`` pixels (black fill)."""
    t = _int_parameter(_sample_level(level, rng), pil_img.size[1] / 3) * _sign(rng)
    return _affine(pil_img, (1, 0, 0, 0, 1, t))


def color(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Color` (saturation) by a symmetric factor around 1 (no-op on grayscale)."""
    return ImageEnhance.Color(pil_img).enhance(_symmetric_sample(level, rng))


def color_original(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Color` by ``0.1 + 0.18 * U(0.1, level)`` (the AugMix repository's draw)."""
    return ImageEnhance.Color(pil_img).enhance(_float_parameter(_sample_level(level, rng), 1.8) + 0.1)


def contrast(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Contrast` by a symmetric factor around 1."""
    return ImageEnhance.Contrast(pil_img).enhance(_symmetric_sample(level, rng))


def contrast_original(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Contrast` by ``0.1 + 0.18 * U(0.1, level)``."""
    return ImageEnhance.Contrast(pil_img).enhance(_float_parameter(_sample_level(level, rng), 1.8) + 0.1)


def brightness(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Brightness` by a symmetric factor around 1, brightening scaled by 0.75 (Composer
    damps increases, which saturate quickly)."""
    factor = _symmetric_sample(level, rng)
    if factor > 1:
        factor *= 0.75
    return ImageEnhance.Brightness(pil_img).enhance(factor)


def brightness_original(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Brightness` by ``0.1 + 0.18 * U(0.1, level)``."""
    return ImageEnhance.Brightness(pil_img).enhance(_float_parameter(_sample_level(level, rng), 1.8) + 0.1)


def sharpness(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Sharpness` by a symmetric factor around 1."""
    return ImageEnhance.Sharpness(pil_img).enhance(_symmetric_sample(level, rng))


def sharpness_original(pil_img: Image.Image, level: float, rng: np.random.Generator) -> Image.Image:
    """:class:`PIL.ImageEnhance.Sharpness` by ``0.1 + 0.18 * U(0.1, level)``."""
    return ImageEnhance.Sharpness(pil_img).enhance(_float_parameter(_sample_level(level, rng), 1.8) + 0.1)


_GEOMETRIC_AND_TONAL = [autocontrast, equalize, posterize, rotate, solarize, shear_x, shear_y, translate_x, translate_y]

augmentation_sets: dict[str, list[AugmentationFn]] = {
    "all": [*_GEOMETRIC_AND_TONAL, color, contrast, brightness, sharpness],
    "safe": list(_GEOMETRIC_AND_TONAL),
    "original": [*_GEOMETRIC_AND_TONAL, color_original, contrast_original, brightness_original, sharpness_original],
}


# -- host-side plumbing shared by RandAugment and AugMix --------------------------------------------------------

def as_generator(rng: Any, where: str) -> np.random.Generator:
    """A ``numpy.random.Generator`` from a Generator, an int seed / ``SeedSequence``, or a JAX PRNG key (so the
    functional forms take the same ``key`` the in-jit methods do)."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        raise TypeError(f"{where}: pass rng= (a numpy Generator, an int seed or a JAX PRNG key); the augmentation "
                        "is random and never reads global state.")
    if isinstance(rng, (int, np.integer, np.random.SeedSequence)) and not isinstance(rng, bool):
        return np.random.default_rng(rng)
    import jax  # deferred: the numpy path never needs it

    data = jax.random.key_data(rng) if jax.dtypes.issubdtype(getattr(rng, "dtype", None), jax.dtypes.prng_key) else rng
    words = np.asarray(data)
    if words.dtype != np.uint32:
        raise TypeError(f"{where}: rng must be a numpy Generator, an int seed or a JAX PRNG key, got {rng!r}.")
    return np.random.default_rng([int(w) for w in words.ravel()])


def resolve_augmentation_set(augmentation_set: str | Sequence[AugmentationFn], where: str) -> list[AugmentationFn]:
    """A set name (``'all'``, ``'safe'``, ``'original'``) or Composer-style list of operations -> the list."""
    if isinstance(augmentation_set, str):
        if augmentation_set not in augmentation_sets:
            raise ValueError(f"{where}: augmentation_set must be one of {sorted(augmentation_sets)}, "
                             f"got {augmentation_set!r}.")
        return augmentation_sets[augmentation_set]
    ops = list(augmentation_set)
    if not ops or not all(callable(op) for op in ops):
        raise ValueError(f"{where}: augmentation_set must be a set name or a non-empty list of operations "
                         f"(image, level, rng) -> image, got {augmentation_set!r}.")
    return ops


def describe_augmentation_set(augmentation_set: str | Sequence[AugmentationFn]) -> str:
    """A set's name, or the names of a custom list of operations, for method descriptions."""
    if isinstance(augmentation_set, str):
        return repr(augmentation_set)
    return "[" + ", ".join(getattr(op, "__name__", repr(op)) for op in augmentation_set) + "]"


def validate_normalization(mean, std, where: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(mean, std)`` as float32 arrays (scalar or per channel), or ``None`` for uint8 / ``[0, 1]`` float images."""
    if (mean is None) != (std is None):
        raise ValueError(f"{where}: pass both mean and std (the normalization the float images carry, "
                         f"x = (pixel / 255 - mean) / std) or neither; got mean={mean!r}, std={std!r}.")
    if mean is None:
        return None
    m, s = np.asarray(mean, np.float32).ravel(), np.asarray(std, np.float32).ravel()
    if m.size == 0 or s.size == 0 or not (np.isfinite(m).all() and np.isfinite(s).all()) or (s <= 0).any():
        raise ValueError(f"{where}: mean and std must be finite scalars or per-channel sequences with std > 0, "
                         f"got mean={mean!r}, std={std!r}.")
    return m, s


def _spatial_layout(data_format: str, where: str) -> str:
    if data_format not in ("NHWC", "NCHW"):
        raise ValueError(f"{where}: data_format must be 'NHWC' or 'NCHW', got {data_format!r}.")
    return data_format


def _channel_param(p: np.ndarray, c: int, name: str, where: str) -> np.ndarray:
    if p.size not in (1, c):
        raise ValueError(f"{where}: {name} has {p.size} values but the images have {c} channels.")
    return p.reshape(1, 1, 1, -1)


# Floats within half a uint8 step of [0, 1] still round into [0, 255]; anything further is not a [0, 1] image.
_RANGE_SLACK = 0.5 / 255


def _to_uint8(x: np.ndarray, norm, where: str) -> np.ndarray:
    """NHWC images as uint8 pixels: uint8 as is; floats in [0, 1], or normalized floats undone with ``norm``."""
    if x.dtype == np.uint8:
        return x
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{where}: images must be uint8 pixels or floats, got dtype {x.dtype}.")
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: images contain NaN or inf.")
    x = x.astype(np.float64)
    if norm is None:
        lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
        if lo < -_RANGE_SLACK or hi > 1 + _RANGE_SLACK:
            raise ValueError(
                f"{where}: float images must be in [0, 1] (got values in [{lo:.3g}, {hi:.3g}]); for normalized images "
                "pass the normalization they carry as mean= and std= (x = (pixel / 255 - mean) / std) so the "
                "pixels can be recovered, augmented and normalized again.")
    else:
        c = x.shape[-1]
        x = x * _channel_param(norm[1], c, "std", where) + _channel_param(norm[0], c, "mean", where)
    # Rounding (not torchvision's truncation) makes float images that came from uint8 pixels round-trip exactly.
    return np.rint(np.clip(x * 255.0, 0.0, 255.0)).astype(np.uint8)


def _from_uint8(u: np.ndarray, dtype: np.dtype, norm, where: str) -> np.ndarray:
    if dtype == np.uint8:
        return u
    ftype = np.result_type(dtype, np.float32)
    # The same float32 formula as jaxcomposer.data.normalize_images, so untouched pixels get the loader's values.
    x = u.astype(ftype) / ftype.type(255.0)
    if norm is not None:
        c = u.shape[-1]
        mean = _channel_param(norm[0], c, "mean", where).astype(ftype)
        x = (x - mean) / _channel_param(norm[1], c, "std", where).astype(ftype)
    return x.astype(dtype)


def pil_from_hwc(u_hwc: np.ndarray) -> Image.Image:
    """An ``(H, W, C)`` array as a PIL image. One channel becomes a single-band image (mode ``'L'`` for uint8, what
    torchvision's ``to_pil_image`` gives a 1-channel tensor), three ``'RGB'``. Shared with the functional forms that
    take PIL images (:mod:`jaxcomposer.algorithms.functional_io`)."""
    return Image.fromarray(np.ascontiguousarray(u_hwc[..., 0] if u_hwc.shape[-1] == 1 else u_hwc))


def hwc_from_pil(img: Image.Image, c: int = -1) -> np.ndarray:
    """A PIL image as an ``(H, W, C)`` array (``C = 1`` for single-band modes), the layout the array code works
    in; ``c`` checks the channel count when given."""
    a = np.asarray(img)
    return a.reshape(a.shape[0], a.shape[1], c)


def map_images(f_pil: Callable[[Image.Image, np.random.Generator], Image.Image], img: Any, rng: Any, *,
               data_format: str = "NHWC", mean=None, std=None, where: str = "augment") -> Any:
    """Apply a PIL-to-PIL augmentation to one image or a batch, keeping the input's type, layout, dtype and range.

    ``img`` is a ``PIL.Image.Image``; or an array ``(H, W)``, ``(H, W, C)`` or ``(N, H, W, C)`` (``(C, H, W)`` /
    ``(N, C, H, W)`` with ``data_format='NCHW'``), ``C`` in {1, 3}, of uint8 pixels, floats in ``[0, 1]``, or floats
    normalized as ``(pixel / 255 - mean) / std`` when ``mean`` and ``std`` are given. A single image uses ``rng``
    directly; image ``i`` of a batch uses ``rng.spawn(N)[i]``, so every image's result depends only on the generator
    and its index (any worker or thread may process it).
    """
    gen = as_generator(rng, where)
    if isinstance(img, Image.Image):
        return f_pil(img, gen)
    _spatial_layout(data_format, where)
    norm = validate_normalization(mean, std, where)
    orig = np.asarray(img)
    if orig.ndim not in (2, 3, 4):
        raise ValueError(f"{where}: expected an image (H, W), (H, W, C) or a batch (N, H, W, C) of images, got an "
                         f"array of shape {orig.shape}.")
    x = orig[None, :, :, None] if orig.ndim == 2 else orig[None] if orig.ndim == 3 else orig
    channels_first = data_format == "NCHW" and orig.ndim > 2
    if channels_first:
        x = np.transpose(x, (0, 2, 3, 1))
    c = x.shape[-1]
    if c not in (1, 3):
        raise ValueError(f"{where}: images must have 1 (grayscale) or 3 (RGB) channels in {data_format} layout; got "
                         f"shape {orig.shape}. Flat feature vectors are not images and cannot be augmented.")
    u = _to_uint8(x, norm, where)
    gens = gen.spawn(len(u)) if orig.ndim == 4 else [gen]
    out = np.stack([hwc_from_pil(f_pil(pil_from_hwc(ui), g), c) for ui, g in zip(u, gens)]) if len(u) else u.copy()
    out = _from_uint8(out, x.dtype, norm, where)
    if channels_first:
        out = np.transpose(out, (0, 3, 1, 2))
    return out.reshape(orig.shape)


def image_data_fn(name: str, f_pil: Callable[[Image.Image, np.random.Generator], Image.Image], input_key: str,
                  data_format: str | None, mean, std) -> Callable[[dict, StepCtx], dict]:
    """The ``data`` slot of an image-augmentation Method, ``data(batch, ctx) -> batch``: ``f_pil`` on every image of
    ``batch[input_key]``, drawing from ``ctx.key`` (in the host ``data`` slot, the batch's
    ``numpy.random.Generator``; docs/design.md, "Methods and slots"). ``data_format=None`` follows the model's
    layout (``model_layout``: NCHW for a bridged torch model)."""

    def data_fn(batch: dict, ctx: StepCtx) -> dict:
        if input_key not in batch:
            raise KeyError(f"{name}: the batch has no {input_key!r} entry (keys: {sorted(batch)}); set input_key.")
        x, layout = np.asarray(batch[input_key]), model_layout(data_format, ctx)
        if x.ndim != 4:
            shape = "(N, H, W, C)" if layout == "NHWC" else "(N, C, H, W)"
            raise ValueError(
                f"{name}: batch[{input_key!r}] must be a batch of images {shape} with 1 or 3 channels, got shape "
                f"{x.shape}. {name} augments images; reshape flat inputs to images in the loader (models such as "
                "MLP flatten them again).")
        return {**batch, input_key: map_images(f_pil, x, ctx.key, data_format=layout, mean=mean, std=std,
                                               where=name)}

    return data_fn
