"""Data: in-memory loaders with exact resume, device prefetch, and datasets available offline.

See docs/design.md, "Data". Everything here returns numpy on the host; ``prefetch_to_device`` moves batches to devices.
"""

from jaxcomposer.data.datasets import (
    DIGITS_MEAN,
    DIGITS_STD,
    FASHION_MNIST_CLASSES,
    FASHION_MNIST_DIR,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    DatasetNotFoundError,
    fashion_mnist_available,
    load_digits,
    load_fashion_mnist,
    normalize_images,
)
from jaxcomposer.data.data_spec import DataSpec
from jaxcomposer.data.factory import DATASET_NAMES, TEXT_DATASETS, DatasetInfo, dataset_kind, make_loaders
from jaxcomposer.data.images import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFolderSource,
    ImageLoader,
    TFDSImageSource,
    eval_transform,
    train_transform,
)
from jaxcomposer.data.loader import ArrayLoader, IndexedLoader
from jaxcomposer.data.prefetch import prefetch_to_device
from jaxcomposer.data.text import FILE_SEPARATOR, TokenWindows, lm_arrays, load_stdlib_text, stdlib_files
from jaxcomposer.data.synthetic import SyntheticLoader
from jaxcomposer.data.tfds_adapter import load_tfds
from jaxcomposer.data.transforms import NormalizationFn, NormalizeImages
from jaxcomposer.data.tokens import load_tokenizer, text_file_tokens, tfds_text_tokens

__all__ = [
    "ArrayLoader",
    "DATASET_NAMES",
    "DataSpec",
    "DIGITS_MEAN",
    "DIGITS_STD",
    "DatasetInfo",
    "DatasetNotFoundError",
    "FASHION_MNIST_CLASSES",
    "FASHION_MNIST_DIR",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "FILE_SEPARATOR",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageFolderSource",
    "ImageLoader",
    "NormalizationFn",
    "NormalizeImages",
    "IndexedLoader",
    "SyntheticLoader",
    "TEXT_DATASETS",
    "TFDSImageSource",
    "TokenWindows",
    "eval_transform",
    "dataset_kind",
    "fashion_mnist_available",
    "lm_arrays",
    "load_digits",
    "load_fashion_mnist",
    "load_stdlib_text",
    "load_tfds",
    "load_tokenizer",
    "make_loaders",
    "normalize_images",
    "prefetch_to_device",
    "stdlib_files",
    "text_file_tokens",
    "tfds_text_tokens",
    "train_transform",
]
