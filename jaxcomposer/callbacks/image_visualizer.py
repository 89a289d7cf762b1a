"""``ImageVisualizer``: a grid of the images the model is trained and evaluated on, as Composer's."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from jaxcomposer.core.events import Callback
from jaxcomposer.core.time import Time, TimeUnit
from jaxcomposer.loggers.logger import LoggerDestination

__all__ = ["ImageVisualizer", "to_uint8", "image_grid"]

GRID_COLUMNS = 8  # images per row of the grid (torchvision's make_grid default)
GRID_PADDING = 2  # black pixels between images and around the grid (make_grid's default)


class ImageVisualizer(Callback):
    """Composer's ``ImageVisualizer(interval='100ba', mode='input', num_images=8, channels_last=False,
    input_key=0, target_key=1)``: the first ``num_images`` images of a train batch every ``interval``, and of the
    first batch of every evaluation, as one grid.

    Where they go: ``<run_dir>/images/train-ba<batch>.png`` and ``eval-ba<batch>.png`` (``batch``: batches trained
    so far), when the Trainer has a ``run_dir``; and ``logger.log_images(images, name='Images/Train' or
    'Images/Eval', channels_last=True, step=batch)`` when the logger has that method (Composer's keys; the images
    as ``uint8`` HWC arrays). The grid has 8 images per row, 2 black pixels between them and around it.

    Pixels: ``uint8`` images are written as they are. Float images follow the rule of ``wandb.Image``, which
    Composer's logs through, per image: values below 0 mean the image is normalized, and it is rescaled to [0, 1]
    by its own min and max; values within [0, 1] are multiplied by 255; then rounded and clipped to [0, 255]. So a
    normalized image is shown with full contrast, not with its original colours.

    ``interval``: an int counts batches (as Composer's); ``'Nba'`` logs batch 1, N+1, 2N+1, ... (Composer logs
    before the forward, when the timestamp says N, 2N, ... batches are done: the same batches); ``'Nep'`` logs the
    first batch of epoch 1, N+1, ... (Composer logs every batch of those epochs). ``input_key``/``target_key``
    find the images in a batch: an int indexes an ``(input, target)`` batch (which the Trainer names ``input`` and
    ``target``) or a dict's keys in order, a string is a dict key, a pair of functions ``(get, set)`` reads with
    ``get(batch)``. Images are ``(N, C, H, W)``, or ``(N, H, W, C)`` with ``channels_last``, with 1, 3 or 4
    channels; ``(N, H, W)`` is grayscale.

    Evaluation images need the eval batch on ``state.batch`` at EVAL_BATCH_END (Composer's State has it); a Trainer
    that leaves the last train batch there gets no eval grid. ``mode='segmentation'`` (masks of the model's
    predictions over the images) needs the model's outputs, which stay inside the compiled step here
    (``state.outputs``), so it is refused.
    """

    def __init__(self, interval: int | str | Time = "100ba", mode: str = "input", num_images: int = 8,
                 channels_last: bool = False, input_key: Any = 0, target_key: Any = 1):
        if not isinstance(mode, str) or mode.lower() not in ("input", "segmentation"):
            raise ValueError(f"ImageVisualizer: mode must be 'input' or 'segmentation', got {mode!r}")
        if mode.lower() == "segmentation":
            raise NotImplementedError("ImageVisualizer: mode='segmentation' draws the model's predicted masks, and "
                                      "the model's outputs stay inside the compiled train step here (state.outputs "
                                      "is not kept); use mode='input'")
        if isinstance(interval, bool) or not isinstance(interval, (int, str, Time)):
            raise ValueError(f"ImageVisualizer: interval must be an int of batches or a time string such as "
                             f"'100ba' or '1ep', got {interval!r}")
        self.interval = Time(interval, TimeUnit.BATCH) if isinstance(interval, int) else \
            Time.from_timestring(interval) if isinstance(interval, str) else interval
        if self.interval.unit not in (TimeUnit.BATCH, TimeUnit.EPOCH) or self.interval.value < 1:
            raise ValueError(f"ImageVisualizer: interval must be a positive number of batches or epochs, got "
                             f"{interval!r}")
        if isinstance(num_images, bool) or not isinstance(num_images, int) or num_images < 1:
            raise ValueError(f"ImageVisualizer: num_images must be an int >= 1, got {num_images!r}")
        self.mode, self.num_images, self.channels_last = mode.lower(), num_images, bool(channels_last)
        self.input_key, self.target_key = input_key, target_key
        self.last_image_path: Path | None = None
        self._train_batch = None  # the train batch on state at EVAL_START: an eval batch is any other
        self._eval_logged = False

    def init(self, state, logger) -> None:
        takes_images = any(type(d).log_images is not LoggerDestination.log_images
                           for d in getattr(logger, "destinations", ()))
        if state.run_dir is None and not takes_images:
            warnings.warn("ImageVisualizer: the Trainer has no run_dir and no logger destination takes images, so "
                          "the image grids go nowhere; pass run_dir=... to the Trainer", RuntimeWarning,
                          stacklevel=2)

    def batch_end(self, state, logger) -> None:
        ts, n = state.timestamp, self.interval.value
        due = (ts.batch - 1) % n == 0 if self.interval.unit == TimeUnit.BATCH else \
            ts.batch_in_epoch == 1 and ts.epoch % n == 0
        if due:
            self._log(state, logger, "train")

    def eval_start(self, state, logger) -> None:
        self._train_batch, self._eval_logged = state.batch, False

    def eval_batch_end(self, state, logger) -> None:
        if self._eval_logged:
            return
        self._eval_logged = True
        if state.batch is not None and state.batch is not self._train_batch:
            self._log(state, logger, "eval")

    def _log(self, state, logger, split: str) -> None:
        images = _images(_get(state.batch, self.input_key), self.num_images, self.channels_last)
        batch = int(state.timestamp.batch)
        if state.run_dir is not None:
            path = Path(state.run_dir) / "images" / f"{split}-ba{batch}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            _save_png(image_grid(images), path)
            self.last_image_path = path
        log_images = getattr(logger, "log_images", None)
        if callable(log_images):
            log_images(images=list(images), name=f"Images/{split.capitalize()}", channels_last=True, step=batch)


def _get(batch: Any, key: Any) -> Any:
    """Composer's ``state.batch_get_item(key)`` on the Trainer's dict batches."""
    if isinstance(key, (tuple, list)) and len(key) == 2 and all(callable(f) for f in key):
        return key[0](batch)
    if isinstance(key, int) and not isinstance(key, bool):
        if isinstance(batch, dict):
            keys = ["input", "target"] if {"input", "target"} <= set(batch) and key in (0, 1) else list(batch)
            if not -len(keys) <= key < len(keys):
                raise KeyError(f"ImageVisualizer: input_key={key} is out of range for a batch with keys {list(batch)}")
            return batch[keys[key]]
        return batch[key]
    if isinstance(batch, dict) and key not in batch:
        raise KeyError(f"ImageVisualizer: input_key={key!r} is not in the batch, whose keys are {list(batch)}")
    return batch[key]


def _images(inputs: Any, num_images: int, channels_last: bool) -> np.ndarray:
    """The first ``num_images`` images as ``uint8`` ``(N, H, W, C)``."""
    x = np.asarray(inputs)
    if x.ndim == 3:
        x = x[..., None]
    elif x.ndim != 4:
        raise ValueError(f"ImageVisualizer: expected images (N, C, H, W), (N, H, W, C) or (N, H, W), got an array "
                         f"of shape {x.shape}")
    elif not channels_last:
        x = x.transpose(0, 2, 3, 1)
    if x.shape[-1] not in (1, 3, 4):
        raise ValueError(f"ImageVisualizer: images of shape {np.asarray(inputs).shape} have {x.shape[-1]} channels "
                         f"with channels_last={channels_last}; expected 1, 3 or 4 "
                         f"(pass channels_last={not channels_last} if the channels are on the other axis)")
    return np.stack([to_uint8(image) for image in x[:num_images]])


def to_uint8(image: np.ndarray) -> np.ndarray:
    """One image as ``uint8`` by ``wandb.Image``'s rule (see :class:`ImageVisualizer`), rounding to nearest."""
    image = np.asarray(image)
    if image.dtype == np.uint8:
        return image
    x = image.astype(np.float64)
    low, span = x.min(), np.ptp(x)
    if low < 0:
        x = (x - low) / span if span > 0 else np.zeros_like(x)
    if x.max() <= 1.0:
        x = x * 255.0
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def image_grid(images: np.ndarray, columns: int = GRID_COLUMNS, padding: int = GRID_PADDING) -> np.ndarray:
    """``(N, H, W, C)`` images laid out ``columns`` to a row on a black canvas, ``padding`` pixels apart and from
    the edges: image ``k`` starts at row ``(k // columns) * (H + padding) + padding`` and column
    ``(k % columns) * (W + padding) + padding``."""
    n, h, w, c = images.shape
    cols = min(n, columns)
    rows = -(-n // cols)
    grid = np.zeros((rows * (h + padding) + padding, cols * (w + padding) + padding, c), images.dtype)
    for k, image in enumerate(images):
        top, left = (k // cols) * (h + padding) + padding, (k % cols) * (w + padding) + padding
        grid[top:top + h, left:left + w] = image
    return grid


def _save_png(grid: np.ndarray, path: Path) -> None:
    from PIL import Image

    # uint8 (H, W) is saved as grayscale, (H, W, 3) as RGB, (H, W, 4) as RGBA
    Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid).save(path)

