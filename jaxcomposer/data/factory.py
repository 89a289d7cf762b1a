"""One call from a dataset name to (train loader, eval loader, info), used by configs, benchmarks and notebooks.

Why a fallback: Fashion-MNIST comes from a Debian package that may be missing on a user's machine. A run should
still work out of the box, so we substitute scikit-learn's digits (always installed) and say so loudly, both as a
``warnings.warn`` and in ``DatasetInfo.fallback_note`` so loggers can record it next to the results.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from jaxcomposer.data.datasets import (
    DIGITS_MEAN,
    DIGITS_STD,
    FASHION_MNIST_DIR,
    FASHION_MNIST_INSTALL_HINT,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    fashion_mnist_available,
    load_digits,
    load_fashion_mnist,
)
from jaxcomposer.data.images import (IMAGENET_MEAN, IMAGENET_STD, ImageLoader, TFDSImageSource,
                                     image_folder_split, is_image_folder)
from jaxcomposer.data.loader import ArrayLoader, IndexedLoader, Transform
from jaxcomposer.data.synthetic import SyntheticLoader
from jaxcomposer.data.text import VOCAB_SIZE, TokenWindows, load_stdlib_text
from jaxcomposer.data.tfds_adapter import tfds_eval_split
from jaxcomposer.data.tokens import mask_token_id, text_file_tokens, tfds_text_tokens
from jaxcomposer.errors import DataError, DatasetNotFoundError

DATASET_NAMES = ("fashion_mnist", "digits", "stdlib_text", "imagefolder", "imagenet", "synthetic_images",
                 "synthetic_tokens", "text_files", "tfds_text")
TEXT_DATASETS = ("stdlib_text", "synthetic_tokens", "text_files", "tfds_text")
DEFAULT_TFDS_NAMES = {"imagenet": "imagenet2012", "tfds_text": "c4/en"}
IMAGENET_TRAIN_SIZE, IMAGENET_VAL_SIZE = 1_281_167, 50_000  # the synthetic defaults: ImageNet-1k's epoch


def dataset_kind(name: str) -> str:
    """``'text'`` for ``TEXT_DATASETS`` (``input_ids`` windows), ``'image'`` for the others (``input``/``target``)."""
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASET_NAMES}")
    return "text" if name in TEXT_DATASETS else "image"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about the data.

    ``name`` is the dataset actually loaded (``'digits'`` after a fallback). For text datasets
    (``TEXT_DATASETS``), ``num_classes`` is the vocabulary (256 bytes for ``stdlib_text``, the tokenizer's size
    with added tokens otherwise) and ``input_shape`` is ``(seq_len,)`` while each example in the loaders is
    ``input_ids`` of length ``seq_len + 1`` (inputs ``[:-1]``, targets ``[1:]``); the counts are numbers of
    windows. ``mean``/``std`` are the per-pixel statistics (in [0, 1] units) to normalize uint8 images with
    (``normalize_images``); ``None`` for text.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    num_train: int
    num_eval: int
    fallback_note: str | None = None
    mean: float | tuple[float, ...] | None = None
    std: float | tuple[float, ...] | None = None
    mask_token_id: int | None = None  # text: the tokenizer's [MASK] token, when it has one


def make_loaders(
    name: str,
    batch_size: int,
    eval_batch_size: int,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
    seq_len: int = 128,
    *,
    max_bytes: int | None = None,
    transform: Transform | None = None,
    image_size: int = 224,
    eval_image_size: int | None = None,
    eval_resize: int | None = None,
    num_workers: int = 8,
    tokenizer_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    tfds_name: str | None = None,
    synthetic_num_classes: int = 1000,
    synthetic_vocab_size: int = 50257,
    synthetic_num_train: int = IMAGENET_TRAIN_SIZE,
    synthetic_num_eval: int = IMAGENET_VAL_SIZE,
) -> tuple[IndexedLoader, IndexedLoader, DatasetInfo]:
    """Build loaders for ``name`` in ``DATASET_NAMES``.

    Train loader: shuffled with ``seed``, ``drop_last=True``, optional host ``transform``. Eval loader: in order,
    ``drop_last=False`` (every example evaluated once). Images are uint8 ``{'input', 'target'}`` batches;
    text is ``{'input_ids'}`` windows. The digits train/test split always uses split seed 0 (not ``seed``), so
    eval sets stay comparable across training seeds. ``data_dir`` is the dataset's folder (Fashion-MNIST's IDX
    files; ``train/`` and ``val/`` of an ImageFolder tree or of text files; a TFDS ``data_dir``);
    ``max_bytes`` truncates each split of a text corpus (for tests and smoke runs). The other keywords are
    ``DATA_OPTIONS``' (jaxcomposer/options.py), where each is documented.
    """
    if name in ("imagefolder", "imagenet"):
        return _image_loaders(name, batch_size, eval_batch_size, seed, data_dir, transform, image_size,
                              num_workers, tfds_name, eval_image_size, eval_resize)
    if name in ("synthetic_images", "synthetic_tokens"):
        kind = name.removeprefix("synthetic_")
        common = dict(shape=(image_size, image_size, 3), num_classes=synthetic_num_classes, seq_len=seq_len,
                      vocab_size=synthetic_vocab_size)
        train = SyntheticLoader(kind, synthetic_num_train, batch_size, **common, data_seed=0, shuffle=True,
                                seed=seed, drop_last=True, transform=transform)
        eval_side = eval_image_size or image_size
        evals = SyntheticLoader(kind, synthetic_num_eval, eval_batch_size, **{**common, "shape": (eval_side,) * 2 + (3,)},
                                data_seed=1, shuffle=False, seed=seed, drop_last=False)
        image = kind == "images"
        info = DatasetInfo(name, synthetic_num_classes if image else synthetic_vocab_size,
                           train.shape if image else (seq_len,), train.num_samples, evals.num_samples,
                           mean=IMAGENET_MEAN if image else None, std=IMAGENET_STD if image else None)
        return train, evals, info
    if name == "text_files":
        (train_tokens, vocab), (eval_tokens, _) = (
            text_file_tokens(data_dir, split, tokenizer_dir, cache_dir=cache_dir, max_bytes=max_bytes)
            for split in ("train", "val"))
        return _token_loaders(name, train_tokens, eval_tokens, vocab, batch_size, eval_batch_size, seed, seq_len,
                              transform, tokenizer_dir)
    if name == "tfds_text":
        tfds_name = tfds_name or DEFAULT_TFDS_NAMES[name]
        (train_tokens, vocab), (eval_tokens, _) = (
            tfds_text_tokens(tfds_name, split, data_dir, tokenizer_dir, cache_dir=cache_dir, max_bytes=max_bytes)
            for split in ("train", tfds_eval_split(tfds_name, data_dir)))
        return _token_loaders(name, train_tokens, eval_tokens, vocab, batch_size, eval_batch_size, seed, seq_len,
                              transform, tokenizer_dir)
    note = None
    if name == "fashion_mnist" and not fashion_mnist_available(data_dir):
        where = data_dir if data_dir is not None else FASHION_MNIST_DIR
        note = (
            f"Fashion-MNIST not found at {where}; using scikit-learn digits instead. "
            f"To use Fashion-MNIST, {FASHION_MNIST_INSTALL_HINT}."
        )
        warnings.warn(note, stacklevel=2)
        name = "digits"

    if name == "fashion_mnist":
        train, test = load_fashion_mnist("train", data_dir), load_fashion_mnist("test", data_dir)
        num_classes = 10
    elif name == "digits":
        train, test = load_digits("train", seed=0), load_digits("test", seed=0)
        num_classes = 10
    elif name == "stdlib_text":
        train = {"input_ids": TokenWindows(load_stdlib_text("train", max_bytes=max_bytes), seq_len)}
        test = {"input_ids": TokenWindows(load_stdlib_text("val", max_bytes=max_bytes), seq_len)}
        num_classes = VOCAB_SIZE
    else:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASET_NAMES}")

    main_key = "input_ids" if name == "stdlib_text" else "input"
    input_shape = (seq_len,) if name == "stdlib_text" else tuple(train[main_key].shape[1:])
    train_loader = ArrayLoader(train, batch_size, shuffle=True, seed=seed, drop_last=True, transform=transform)
    eval_loader = ArrayLoader(test, eval_batch_size, shuffle=False, seed=seed, drop_last=False)
    info = DatasetInfo(
        name=name,
        num_classes=num_classes,
        input_shape=input_shape,
        num_train=train_loader.num_samples,
        num_eval=eval_loader.num_samples,
        fallback_note=note,
        mean=None if name == "stdlib_text" else (FASHION_MNIST_MEAN if name == "fashion_mnist" else DIGITS_MEAN),
        std=None if name == "stdlib_text" else (FASHION_MNIST_STD if name == "fashion_mnist" else DIGITS_STD),
    )
    return train_loader, eval_loader, info


def _image_loaders(name, batch_size, eval_batch_size, seed, data_dir, transform, image_size, num_workers,
                   tfds_name, eval_image_size, eval_resize):
    """ImageFolder ``data_dir/{train,val}``, or (``imagenet`` without such a tree) a TFDS dataset in data_dir."""
    if name == "imagefolder" or is_image_folder(data_dir):
        if data_dir is None:
            raise DatasetNotFoundError(f"{name!r} needs data_dir: a folder with train/<class>/*.jpg and "
                                       f"val/<class>/*.jpg (torchvision's ImageFolder layout)")
        train_source, eval_source = image_folder_split(data_dir, "train"), image_folder_split(data_dir, "val")
        if train_source.classes != eval_source.classes:
            raise DataError(f"{data_dir}/train and {data_dir}/val have different class folders: "
                            f"{sorted(set(train_source.classes) ^ set(eval_source.classes))} are in only one")
    else:
        tfds_name = tfds_name or DEFAULT_TFDS_NAMES[name]
        try:
            eval_split = tfds_eval_split(tfds_name, data_dir)
        except DatasetNotFoundError as e:
            raise DatasetNotFoundError(
                f"imagenet: no ImageFolder tree at {data_dir}/train and {e}. Provide either data_dir with "
                f"train/<wnid>/*.JPEG and val/<wnid>/*.JPEG, or a TFDS data_dir where {tfds_name!r} is prepared "
                f"(array_record; ImageNet's archives must be placed in <data_dir>/downloads/manual first)"
            ) from e
        train_source = TFDSImageSource(tfds_name, "train", data_dir)
        eval_source = TFDSImageSource(tfds_name, eval_split, data_dir)
    common = dict(seed=seed, num_workers=num_workers)
    train = ImageLoader(train_source, batch_size, train=True, shuffle=True, drop_last=True, transform=transform,
                        image_size=image_size, **common)
    evals = ImageLoader(eval_source, eval_batch_size, train=False, shuffle=False, drop_last=False,
                        image_size=eval_image_size or image_size, eval_resize=eval_resize, **common)
    info = DatasetInfo(name, len(train.classes), (image_size, image_size, 3), train.num_samples, evals.num_samples,
                       mean=IMAGENET_MEAN, std=IMAGENET_STD)
    return train, evals, info


def _token_loaders(name, train_tokens, eval_tokens, vocab, batch_size, eval_batch_size, seed, seq_len, transform,
                   tokenizer_dir):
    train = ArrayLoader({"input_ids": TokenWindows(train_tokens, seq_len)}, batch_size, shuffle=True, seed=seed,
                        drop_last=True, transform=transform)
    evals = ArrayLoader({"input_ids": TokenWindows(eval_tokens, seq_len)}, eval_batch_size, shuffle=False,
                        seed=seed, drop_last=False)
    return train, evals, DatasetInfo(name, vocab, (seq_len,), train.num_samples, evals.num_samples,
                                     mask_token_id=mask_token_id(tokenizer_dir))
