"""Image normalization as ``DataSpec`` batch transforms, run inside the compiled steps.

- ``NormalizeImages(mean, std)``: ``normalize_images``' values (``(x / 255 - mean) / std``, statistics in [0, 1]
  units, channels last), what ``jaxcomposer fit`` uses.
- ``NormalizationFn(mean, std, ignore_background=False)``: Composer's ``composer.datasets.utils.NormalizationFn``
  (``(x - mean) / std``, statistics in pixel units, e.g. ``IMAGENET_CHANNEL_MEAN``; channels at axis 1, NCHW, as
  Composer's; ``channels_axis=-1`` for our NHWC models), so a Composer script's
  ``DataSpec(loader, device_transforms=NormalizationFn(...))`` runs with its import changed.

uint8 pixels take one of 256 values per channel, so both look them up in a table computed on the host with
numpy: bit for bit the values the same formula gives on the host (XLA's own arithmetic rounds ~2/3 of them
differently, by one unit in the last place), so normalizing in the step trains exactly as normalizing in the
loader did. On small images the lookup costs what the arithmetic does; on large ones it costs more, yet stays a
small part of a step and far below normalizing on the host. Inputs that are not uint8 get the arithmetic.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import jax.numpy as jnp
import numpy as np

from jaxcomposer.data.datasets import normalize_images


def pixel_table(host_fn: Callable[[np.ndarray], np.ndarray], channels: int) -> np.ndarray:
    """``(256, channels)`` float32: ``host_fn`` of every uint8 level, per channel (``host_fn`` takes and returns
    channels-last arrays)."""
    levels = np.repeat(np.arange(256, dtype=np.uint8)[:, None], channels, axis=1)
    return np.asarray(host_fn(levels.reshape(256, 1, channels)), np.float32).reshape(256, channels)


def lookup_pixels(table: np.ndarray, x, channels_axis: int = -1):
    """uint8 ``x`` through ``table`` (``pixel_table``): one gather, the channel taken from ``channels_axis``."""
    channels = table.shape[1]
    flat, pixels = jnp.asarray(table.reshape(-1)), x.astype(jnp.int32) * channels
    if channels > 1:
        shape = [1] * x.ndim
        shape[channels_axis] = channels
        pixels = pixels + jnp.arange(channels, dtype=jnp.int32).reshape(shape)
    return jnp.take(flat, pixels, mode="clip")


def _channels(stat) -> int:
    return int(np.size(stat))


def _fits(x, channels: int, channels_axis: int) -> bool:
    return x.dtype == np.uint8 and channels in (1, x.shape[channels_axis])


class NormalizeImages:
    """``batch[key]`` (uint8 NHWC images) as ``normalize_images(x, mean, std)`` float32, in the step."""

    def __init__(self, mean: float | Sequence[float], std: float | Sequence[float], key: str = "input"):
        self.mean, self.std, self.key = mean, std, key
        self.table = pixel_table(lambda levels: normalize_images(levels, mean, std), max(_channels(mean),
                                                                                            _channels(std)))

    def __call__(self, batch: dict) -> dict:
        x = batch[self.key]
        if not _fits(x, self.table.shape[1], -1):
            return {**batch, self.key: normalize_images(x, self.mean, self.std)}
        return {**batch, self.key: lookup_pixels(self.table, x)}


class NormalizationFn:
    """Composer's ``NormalizationFn``: ``(x - mean) / std`` as float32, statistics in pixel units (0-255), channels
    at ``channels_axis`` (1: NCHW, Composer's; -1 for NHWC). ``ignore_background`` subtracts 1 from the targets
    (segmentation labels whose class 0 is background), as Composer's. Takes and returns an ``(input, target)``
    pair or a batch dict (``input``/``target``)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], ignore_background: bool = False,
                 channels_axis: int = 1):
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        self.ignore_background, self.channels_axis = ignore_background, channels_axis
        self.table = pixel_table(lambda levels: (levels.astype(np.float32) - self.mean) / self.std,
                                 max(self.mean.size, self.std.size))

    def _normalize(self, x):
        if _fits(x, self.table.shape[1], self.channels_axis):
            return lookup_pixels(self.table, x, self.channels_axis)
        shape = [1] * x.ndim
        shape[self.channels_axis] = -1
        return (x.astype(jnp.float32) - self.mean.reshape(shape)) / self.std.reshape(shape)

    def __call__(self, batch):
        pair = isinstance(batch, (tuple, list))
        xs, ys = batch if pair else (batch["input"], batch["target"])
        xs = self._normalize(xs)
        if self.ignore_background:
            ys = ys - 1
        return (xs, ys) if pair else {**batch, "input": xs, "target": ys}
