"""Image classification from files: an ImageFolder tree or a prepared TFDS dataset (ImageNet), decoded on the host.

What it is: the input pipeline of torchvision's ImageNet recipe (the one Composer's ResNet-50 benchmarks use).
Train: ``RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3))`` + horizontal flip with p = 0.5. Eval:
``Resize(int(size / 0.875))`` (or ``eval_resize``) of the shorter side + ``CenterCrop(size)``. Both bilinear, through PIL, as
torchvision does for PIL images. Output ``{'input': (B, size, size, 3) uint8, 'target': (B,) int32}``; images stay
uint8 so the host moves 4x fewer bytes, and are normalized later with ``IMAGENET_MEAN``/``IMAGENET_STD`` (see
``normalize_images``), as the other image datasets are.

What differs from torchvision and why:

- Randomness is numpy's, per example, from ``(seed, epoch, batch index, position in batch)``, instead of torch's
  global generator. So a resumed run crops and flips exactly as the uninterrupted one (``IndexedLoader``'s
  exact resume covers the transforms too), and the result does not depend on ``num_workers``. The crop
  distribution is torchvision's (same ten attempts, same fallback); the individual draws are not.
- Workers are threads, not processes: PIL releases the GIL while decoding and resizing, and threads need no
  pickling or shared memory. ``ThreadPoolExecutor.map`` keeps the batch order.
- TFDS images are read as encoded bytes (``SkipDecoding``) and decoded here with PIL, so TFDS needs neither
  TensorFlow nor OpenCV, and decoding runs in the worker threads.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from jaxcomposer.data.loader import Batch, IndexedLoader, Transform, derive_seed
from jaxcomposer.data.tfds_adapter import get_many, open_tfds_source
from jaxcomposer.errors import DataError, DatasetNotFoundError
from jaxcomposer.utils.extras import optional_import

# torchvision's ImageNet statistics, for pixels scaled to [0, 1] (``normalize_images(x, IMAGENET_MEAN, ...)``).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively as torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
EVAL_CROP_FRACTION = 0.875  # resize to size / 0.875 (256 for 224), then crop the center size x size
_AUGMENT_TAG = 2  # loader.py uses 0 (shuffle) and 1 (batch transforms)


# -- transforms (PIL in, PIL out) ----------------------------------------------------------------------------
def random_resized_crop_box(width: int, height: int, rng: np.random.Generator,
                            scale: Sequence[float] = CROP_SCALE,
                            ratio: Sequence[float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` with a numpy generator: ``(top, left, h, w)``."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height  # fallback: the whole image, clipped to the ratio range, centered
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_transform(image: Image.Image, size: int, rng: np.random.Generator) -> Image.Image:
    """RandomResizedCrop(size) then a horizontal flip with probability 1/2."""
    top, left, h, w = random_resized_crop_box(*image.size, rng)
    image = image.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return image


def eval_transform(image: Image.Image, size: int, resize: int | None = None) -> Image.Image:
    """Resize the shorter side to ``resize`` (default ``int(size / 0.875)``, torchvision's rounding), then
    CenterCrop(size)."""
    width, height = image.size
    short_target = int(size / EVAL_CROP_FRACTION) if resize is None else int(resize)
    short, long = min(width, height), max(width, height)
    long_target = int(short_target * long / short)
    new_w, new_h = (short_target, long_target) if width <= height else (long_target, short_target)
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return image.crop((left, top, left + size, top + size))


# -- sources: example index -> (something PIL opens, label) ---------------------------------------------------
class ImageFolderSource:
    """torchvision's ``ImageFolder`` listing of ``root``: classes are the sorted sub-folder names, files are
    walked in sorted order per class, and only ``IMG_EXTENSIONS`` count. A class folder without images is an
    error (torchvision raises too), naming the folder."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetNotFoundError(
                f"image folder {self.root} does not exist; it should hold one sub-folder per class with the "
                f"class's images ({', '.join(IMG_EXTENSIONS)}), e.g. {self.root}/n01440764/xxx.JPEG")
        self.classes = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        if not self.classes:
            raise DataError(f"image folder {self.root} has no class sub-folders; put each class's images in "
                            f"{self.root}/<class name>/")
        paths, labels = [], []
        for label, name in enumerate(self.classes):
            found = [os.path.join(d, f) for d, _, files in sorted(os.walk(self.root / name, followlinks=True))
                     for f in sorted(files) if f.lower().endswith(IMG_EXTENSIONS)]
            if not found:
                raise DataError(f"class folder {self.root / name} has no images with an extension in "
                                f"{IMG_EXTENSIONS}; remove the folder or add its images")
            paths += found
            labels += [label] * len(found)
        self.paths, self.labels = paths, np.asarray(labels, np.int32)

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, indices: np.ndarray) -> list[tuple[str, int]]:
        return [(self.paths[i], int(self.labels[i])) for i in indices]


class TFDSImageSource:
    """A prepared TFDS image-classification dataset (``image`` and ``label`` features), read as encoded bytes."""

    def __init__(self, name: str, split: str, data_dir: str | os.PathLike | None,
                 image_key: str = "image", label_key: str = "label"):
        tfds = optional_import("tensorflow_datasets", needed_by=f"the TFDS dataset {name!r}",
                               package="tensorflow-datasets", extra="tfds")

        self.source, builder = open_tfds_source(name, split, data_dir,
                                                decoders={image_key: tfds.decode.SkipDecoding()})
        self.image_key, self.label_key = image_key, label_key
        self.classes = list(builder.info.features[label_key].names)

    def __len__(self) -> int:
        return len(self.source)

    def read(self, indices: np.ndarray) -> list[tuple[io.BytesIO, int]]:
        # Reading is batched in the loading thread (array_record readers are not documented as thread-safe);
        # decoding, the expensive part, runs in the workers.
        records = get_many(self.source, [int(i) for i in indices])
        return [(io.BytesIO(r[self.image_key]), int(r[self.label_key])) for r in records]


# -- the loader -----------------------------------------------------------------------------------------------
class ImageLoader(IndexedLoader):
    """Batches of decoded, transformed images from a source; position and resume as :class:`IndexedLoader`.

    ``train=True`` applies the random train transform, else the deterministic eval transform. ``num_workers``
    threads decode one example each (``<= 1``: in the loading thread); the result is identical for every
    ``num_workers``. ``transform(batch, rng)`` runs afterwards on the uint8 batch, as for ``ArrayLoader``.
    """

    def __init__(self, source, batch_size: int, *, image_size: int = 224, train: bool, shuffle: bool,
                 seed: int = 0, drop_last: bool, num_workers: int = 8, transform: Transform | None = None,
                 eval_resize: int | None = None):
        for arg, value, low in (("batch_size", batch_size, 1), ("image_size", image_size, 1),
                                ("num_workers", num_workers, 0), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise DataError(f"{arg} must be an int >= {low}, got {value!r}")
        if len(source) == 0:
            raise DataError(f"image dataset {source!r} is empty")
        super().__init__(len(source), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         transform=transform)
        if eval_resize is not None and (not isinstance(eval_resize, (int, np.integer)) or eval_resize < image_size):
            raise DataError(f"eval_resize must be an int >= image_size ({image_size}), got {eval_resize!r}")
        self.source, self.image_size, self.train = source, int(image_size), bool(train)
        self.eval_resize = eval_resize
        self.num_workers = int(num_workers)
        self.classes = list(source.classes)
        self._pool: ThreadPoolExecutor | None = None

    def _example(self, item: tuple[object, int, int]) -> np.ndarray:
        opened, seed, _ = item
        with Image.open(opened) as image:
            image = image.convert("RGB")  # grayscale, palette, RGBA -> RGB, as torchvision's pil_loader
            if self.train:
                image = train_transform(image, self.image_size, np.random.default_rng(seed))
            else:
                image = eval_transform(image, self.image_size, self.eval_resize)
            return np.asarray(image, dtype=np.uint8)

    def _gather(self, indices: np.ndarray) -> Batch:
        return self._gather_rows(indices, 0, len(indices))

    def _gather_rows(self, indices: np.ndarray, lo: int, hi: int) -> Batch:
        # IndexedLoader gathers batch i while its position still reads (epoch, i): the position is advanced only
        # after the batch is built. That pair, with the seed and the slot in the (whole) batch, seeds each
        # example, so a process decoding only its rows crops them as one process decoding all would.
        epoch, batch_index = self._epoch, self._batch_index
        records = self.source.read(indices[lo:hi])
        items = [(opened, derive_seed(self.seed, epoch, batch_index, lo + pos, _AUGMENT_TAG), label)
                 for pos, (opened, label) in enumerate(records)]
        if self.num_workers > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="jaxcomposer-images")
            images = list(self._pool.map(self._example, items))
        else:
            images = [self._example(item) for item in items]
        return {"input": np.stack(images), "target": np.asarray([label for *_, label in items], np.int32)}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=False)

    def __repr__(self) -> str:
        return (f"ImageLoader(num_samples={self._n}, classes={len(self.classes)}, batch_size={self.batch_size}, "
                f"image_size={self.image_size}, train={self.train}, num_workers={self.num_workers}, "
                f"epoch={self._epoch}, batch_index={self._batch_index})")


def image_folder_split(root: str | os.PathLike, split: str) -> ImageFolderSource:
    """``root/<split>`` as an ImageFolder; ``split`` is 'train' or 'val'."""
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    return ImageFolderSource(Path(root) / split)


def is_image_folder(root: str | os.PathLike | None) -> bool:
    return root is not None and (Path(root) / "train").is_dir()

