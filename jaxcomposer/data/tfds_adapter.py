"""Read a prepared TFDS dataset into numpy arrays without TensorFlow.

Why this path: TFDS 4.9.10 reads ``array_record`` datasets through ``builder.as_data_source(split)`` with no
TensorFlow installed (docs/design.md, "Data"), while ``tfds.load``/``as_dataset``/``as_numpy`` and the TFRecord format
all need TF. So datasets must be prepared with ``file_format='array_record'``; the errors below say so.
``tfds.testing.mock_data`` also works here, which is how the quickstart and tests can use TFDS offline.
"""

from __future__ import annotations

import os

import numpy as np

from jaxcomposer.errors import DatasetNotFoundError
from jaxcomposer.utils.extras import optional_import

RECORDS_PER_FETCH = 4096  # records fetched per __getitems__ call: bounded temporary memory, few Python round trips


def get_many(source, keys: list[int]) -> list:
    """Batched reads; ``tfds.testing.mock_data`` (4.9.10) patches ``__getitems__`` with a broken signature
    (``TypeError: _getitems() missing ... 'record_keys'``), so fall back to one record at a time there."""
    try:
        return list(source.__getitems__(keys))
    except (AttributeError, TypeError):
        return [source[k] for k in keys]


def open_tfds_source(name: str, split: str, data_dir: str | os.PathLike | None, *, decoders=None):
    """``(random-access source of split, builder)`` for a prepared TFDS dataset, records read lazily.

    ``decoders`` is TFDS's (``{'image': tfds.decode.SkipDecoding()}`` keeps encoded bytes). Nothing is downloaded:
    an unprepared dataset raises ``DatasetNotFoundError`` saying where it was looked for.
    """
    tfds = optional_import("tensorflow_datasets", needed_by=f"the TFDS dataset {name!r}",
                           package="tensorflow-datasets", extra="tfds")

    builder = tfds.builder(name, data_dir=os.fspath(data_dir) if data_dir is not None else None)
    try:
        return builder.as_data_source(split, decoders=decoders), builder
    except Exception as error:
        if not builder.is_prepared():
            raise DatasetNotFoundError(
                f"TFDS dataset {name!r} is not prepared under {builder.data_dir}; prepare it (with network, "
                f"file_format='array_record') using `tfds.builder({name!r}, data_dir=...).download_and_prepare("
                f"file_format='array_record')` or copy a prepared dataset there"
            ) from error
        raise


def load_tfds(
    name: str,
    split: str,
    data_dir: str | os.PathLike | None,
    *,
    image_key: str = "image",
    label_key: str | None = "label",
) -> dict[str, np.ndarray]:
    """Load ``split`` of the TFDS dataset ``name`` from ``data_dir`` as ``{'input': ..., 'target': int32}``.

    ``image_key`` becomes ``'input'`` (dtype kept, e.g. uint8 NHWC images) and ``label_key`` becomes ``'target'``
    (cast to int32); pass ``label_key=None`` for unlabelled data. Other features are ignored. Nothing is
    downloaded: the dataset must already be prepared in ``data_dir`` in the array_record format.
    """
    source, _ = open_tfds_source(name, split, data_dir)
    n = len(source)
    if n == 0:
        raise ValueError(f"TFDS dataset {name!r} split {split!r} is empty")
    keys = [image_key] + ([label_key] if label_key is not None else [])
    columns: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    for start in range(0, n, RECORDS_PER_FETCH):
        records = get_many(source, list(range(start, min(start + RECORDS_PER_FETCH, n))))
        for key in keys:
            if key not in records[0]:
                raise KeyError(f"TFDS dataset {name!r} has no feature {key!r}; features: {sorted(records[0])}")
            columns[key].append(np.stack([np.asarray(r[key]) for r in records]))
    out = {"input": np.concatenate(columns[image_key])}
    if label_key is not None:
        out["target"] = np.concatenate(columns[label_key]).astype(np.int32)
    return out


def tfds_eval_split(name: str, data_dir: str | os.PathLike | None) -> str:
    """The held-out split a TFDS dataset has: 'validation' (c4, imagenet2012), else 'test'."""
    _, builder = open_tfds_source(name, "train", data_dir)
    for split in ("validation", "test"):
        if split in builder.info.splits:
            return split
    raise ValueError(f"TFDS dataset {name!r} has no 'validation' or 'test' split; splits: "
                     f"{sorted(builder.info.splits)}")
