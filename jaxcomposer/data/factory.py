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
    FASHION_MNIST_DIR,
    FASHION_MNIST_INSTALL_HINT,
    fashion_mnist_available,
    load_digits,
    load_fashion_mnist,
)
from jaxcomposer.data.loader import ArrayLoader, Transform
from jaxcomposer.data.text import VOCAB_SIZE, TokenWindows, load_stdlib_text

DATASET_NAMES = ("fashion_mnist", "digits", "stdlib_text")


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model needs to know about the data.

    ``name`` is the dataset actually loaded (``'digits'`` after a fallback). For ``stdlib_text``,
    ``num_classes`` is the byte vocabulary (256) and ``input_shape`` is ``(seq_len,)`` while each example in
    the loaders is ``input_ids`` of length ``seq_len + 1`` (inputs ``[:-1]``, targets ``[1:]``); the counts are
    numbers of windows.
    """

    name: str
    num_classes: int
    input_shape: tuple[int, ...]
    num_train: int
    num_eval: int
    fallback_note: str | None = None


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
) -> tuple[ArrayLoader, ArrayLoader, DatasetInfo]:
    """Build loaders for ``name`` in ``DATASET_NAMES``.

    Train loader: shuffled with ``seed``, ``drop_last=True``, optional host ``transform``. Eval loader: in order,
    ``drop_last=False`` (every example evaluated once). Images are uint8 ``{'input', 'target'}`` batches;
    text is ``{'input_ids'}`` windows. The digits train/test split always uses split seed 0 (not ``seed``), so
    eval sets stay comparable across training seeds. ``data_dir`` is the Fashion-MNIST IDX folder;
    ``max_bytes`` truncates each split of the text corpus (for tests and smoke runs).
    """
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
    )
    return train_loader, eval_loader, info
