"""Synthetic data for throughput runs: per-example determinism, shapes and ranges, nominal epochs, exact resume."""

import numpy as np
import pytest

from jaxcomposer.data import IMAGENET_MEAN, SyntheticLoader, dataset_kind, make_loaders
from jaxcomposer.errors import DataError


def _batches(loader):
    return [{k: v.copy() for k, v in b.items()} for b in loader]


def test_synthetic_images_shapes_ranges_and_info():
    train, evals, info = make_loaders("synthetic_images", 4, 5, seed=2, image_size=8, synthetic_num_classes=3,
                                      synthetic_num_train=10, synthetic_num_eval=7)
    assert (info.num_classes, info.input_shape, info.num_train, info.num_eval) == (3, (8, 8, 3), 10, 7)
    assert info.mean == IMAGENET_MEAN and dataset_kind("synthetic_images") == "image"
    assert (len(train), len(evals)) == (2, 2)  # drop_last for train, every eval example once
    batch = next(iter(train))
    assert batch["input"].shape == (4, 8, 8, 3) and batch["input"].dtype == np.uint8
    assert batch["target"].dtype == np.int32 and set(batch["target"]) <= {0, 1, 2}
    pixels = np.concatenate([b["input"] for b in _batches(evals)]).ravel()
    assert pixels.min() < 8 and pixels.max() > 247 and abs(pixels.mean() - 127.5) < 6  # ~uniform bytes


def test_synthetic_tokens_shapes_and_ranges():
    train, evals, info = make_loaders("synthetic_tokens", 3, 3, seq_len=16, synthetic_vocab_size=50,
                                      synthetic_num_train=9, synthetic_num_eval=4)
    assert (info.num_classes, info.input_shape, dataset_kind("synthetic_tokens")) == (50, (16,), "text")
    ids = np.concatenate([b["input_ids"] for b in _batches(train)])
    assert ids.shape == (9, 17) and ids.dtype == np.int32 and ids.min() >= 0 and ids.max() < 50
    assert len(np.unique(ids)) > 40


def test_examples_are_a_function_of_data_seed_and_index_only():
    a = SyntheticLoader("images", 12, 4, shape=(4, 4, 3), num_classes=5, seed=0)
    b = SyntheticLoader("images", 12, 4, shape=(4, 4, 3), num_classes=5, seed=9)  # another order, same examples
    for loader in (a, b):
        indices = loader.epoch_indices(0)
        for batch, idx in zip(_batches(loader), indices):
            for row, i in enumerate(idx):
                example = a.example(int(i))
                np.testing.assert_array_equal(batch["input"][row], example["input"])
                assert batch["target"][row] == example["target"]
    assert not np.array_equal(a.epoch_indices(0)[0], b.epoch_indices(0)[0])
    other = SyntheticLoader("images", 12, 4, shape=(4, 4, 3), num_classes=5, data_seed=1)
    assert not np.array_equal(other.example(0)["input"], a.example(0)["input"])
    train, evals, _ = make_loaders("synthetic_tokens", 2, 2, seq_len=8, synthetic_num_train=4, synthetic_num_eval=4)
    assert not np.array_equal(train.example(0)["input_ids"], evals.example(0)["input_ids"])  # eval data held out


def test_deterministic_across_instances_and_resume_is_exact():
    def loader():
        return SyntheticLoader("tokens", 20, 3, seq_len=6, vocab_size=100, seed=4)

    full = _batches(loader())
    again = loader()
    it = iter(again)
    head = [{k: v.copy() for k, v in next(it).items()} for _ in range(2)]
    resumed = loader()
    resumed.set_state(again.get_state())
    rest = _batches(resumed)
    assert len(full) == 6 and len(head) + len(rest) == 6
    for x, y in zip(head + rest, full):
        np.testing.assert_array_equal(x["input_ids"], y["input_ids"])


def test_bad_arguments_are_named():
    with pytest.raises(DataError, match="kind must be 'images' or 'tokens', got 'audio'"):
        SyntheticLoader("audio", 4, 2)
    with pytest.raises(DataError, match="num_classes must be a positive int, got 0"):
        SyntheticLoader("images", 4, 2, num_classes=0)
    with pytest.raises(DataError, match="num_samples must be a positive int"):
        SyntheticLoader("tokens", -1, 2)
