"""Offline datasets: Fashion-MNIST (IDX), digits, the stdlib byte corpus, the TFDS adapter and make_loaders."""

import gzip
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jaxcomposer.data import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    DatasetNotFoundError,
    fashion_mnist_available,
    lm_arrays,
    load_digits,
    load_fashion_mnist,
    load_stdlib_text,
    load_tfds,
    make_loaders,
    normalize_images,
    stdlib_files,
)
from jaxcomposer.data.text import FILE_SEPARATOR, split_files, stdlib_root

needs_fashion = pytest.mark.skipif(not fashion_mnist_available(), reason="apt-get install -y dataset-fashion-mnist")


def _write_idx(path, magic, array):
    header = np.array([magic, *array.shape], ">i4").tobytes()
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def _fake_fashion_dir(tmp_path, n=12):
    rng = np.random.default_rng(0)
    for prefix in ("train", "t10k"):
        _write_idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", 2051, rng.integers(0, 256, (n, 28, 28)))
        _write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", 2049, np.arange(n) % 10)
    return tmp_path


# -- Fashion-MNIST -------------------------------------------------------------------------------------------
@needs_fashion
def test_fashion_mnist_shapes_dtypes_and_balance():
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    assert train["input"].shape == (60000, 28, 28, 1) and train["input"].dtype == np.uint8
    assert test["input"].shape == (10000, 28, 28, 1) and test["target"].dtype == np.int32
    np.testing.assert_array_equal(np.bincount(train["target"]), [6000] * 10)
    np.testing.assert_array_equal(np.bincount(test["target"]), [1000] * 10)
    scaled = train["input"] / 255.0
    assert abs(scaled.mean() - FASHION_MNIST_MEAN) < 1e-4 and abs(scaled.std() - FASHION_MNIST_STD) < 1e-4


def test_fashion_mnist_reads_custom_dir_and_validates(tmp_path):
    data = load_fashion_mnist("test", data_dir=_fake_fashion_dir(tmp_path))
    assert data["input"].shape == (12, 28, 28, 1) and list(data["target"][:3]) == [0, 1, 2]
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 2051, np.zeros(12))  # wrong magic
    with pytest.raises(ValueError, match="magic number 2051, expected 2049"):
        load_fashion_mnist("test", data_dir=tmp_path)
    with pytest.raises(ValueError, match="split"):
        load_fashion_mnist("val", data_dir=tmp_path)


def test_fashion_mnist_missing_files_error(tmp_path):
    assert not fashion_mnist_available(tmp_path)
    with pytest.raises(DatasetNotFoundError) as info:
        load_fashion_mnist("train", data_dir=tmp_path)
    message = str(info.value)
    assert str(tmp_path / "train-images-idx3-ubyte.gz") in message
    assert "apt-get install -y dataset-fashion-mnist" in message and "data_dir" in message
    assert isinstance(info.value, FileNotFoundError)


def test_normalize_images_numpy_and_jax_agree():
    x = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 1.0)
    want = (x.astype(np.float32) / 255 - np.array(mean, np.float32)) / np.array(std, np.float32)
    np.testing.assert_allclose(normalize_images(x, mean, std), want, atol=1e-6)
    out = normalize_images(jnp.asarray(x), mean, std)  # strict rank promotion is on in tests
    assert out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), want, atol=1e-6)
    np.testing.assert_allclose(normalize_images(x[..., :1], 0.5, 0.5), (x[..., :1] / 255 - 0.5) / 0.5, atol=1e-6)


# -- digits --------------------------------------------------------------------------------------------------
def test_digits_split_is_stratified_deterministic_and_disjoint():
    train, test = load_digits("train"), load_digits("test")
    assert train["input"].shape == (1347, 8, 8, 1) and test["input"].shape == (450, 8, 8, 1)
    assert train["input"].dtype == np.uint8 and train["target"].dtype == np.int32
    assert train["input"].max() == 255 and train["input"].min() == 0
    full = np.bincount(np.concatenate([train["target"], test["target"]]))
    np.testing.assert_allclose(np.bincount(test["target"]) / full, 0.25, atol=0.02)  # stratified
    again = load_digits("train")
    np.testing.assert_array_equal(again["input"], train["input"])
    rows = {r.tobytes() for r in train["input"]}
    overlap = sum(r.tobytes() in rows for r in test["input"])
    assert overlap < 5  # only the dataset's few exact duplicates can appear in both splits
    assert not np.array_equal(load_digits("test", seed=1)["target"], test["target"])


# -- stdlib text ---------------------------------------------------------------------------------------------
def test_stdlib_files_exclusions_and_stable_split():
    files = stdlib_files()
    rel = [p.relative_to(stdlib_root()) for p in files]
    assert len(files) > 300 and [r.as_posix() for r in rel] == sorted(r.as_posix() for r in rel)
    assert not any(part in ("test", "tests", "idlelib", "site-packages") for r in rel for part in r.parts[:-1])
    assert any(r.as_posix() == "json/decoder.py" for r in rel)
    train, val = split_files(files, "train"), split_files(files, "val")
    assert set(train).isdisjoint(val) and len(train) + len(val) == len(files)
    assert val == files[19::20] and len(val) == len(files) // 20
    assert split_files(stdlib_files(), "val") == val  # stable across calls


def test_load_stdlib_text_bytes(tmp_path):
    tiny = tmp_path / "lib"
    (tiny / "pkg").mkdir(parents=True)
    (tiny / "tests").mkdir()
    for k in range(40):
        (tiny / "pkg" / f"m{k:02d}.py").write_text(f"x = {k}\n")
    (tiny / "tests" / "test_x.py").write_text("excluded\n")
    val = load_stdlib_text("val", stdlib_dir=tiny)
    assert val.dtype == np.uint8 and val.ndim == 1
    assert val.tobytes() == b"x = 19\n" + FILE_SEPARATOR + b"x = 39\n" + FILE_SEPARATOR
    train = load_stdlib_text("train", stdlib_dir=tiny)
    assert b"excluded" not in train.tobytes() and train.tobytes().count(FILE_SEPARATOR) == 38
    real = load_stdlib_text("train", max_bytes=5000)
    assert real.shape == (5000,) and real.dtype == np.uint8


def test_lm_arrays_shapes():
    tokens = np.arange(1000, dtype=np.uint8)
    arrays = lm_arrays(tokens, 64)
    ids = arrays["input_ids"]
    assert ids.shape == ((1000 - 1) // 64, 65) and ids.dtype == np.int32
    np.testing.assert_array_equal(ids[1], tokens[64:129])
    np.testing.assert_array_equal(ids[0, -1], ids[1, 0])  # windows share one boundary token
    with pytest.raises(ValueError, match="too few"):
        lm_arrays(tokens[:10], 64)


# -- TFDS adapter --------------------------------------------------------------------------------------------
class TinyImages(tfds.core.GeneratorBasedBuilder):
    """A real (not mocked) array_record dataset, built offline without TensorFlow."""

    VERSION = tfds.core.Version("1.0.0")
    # TFDS derives a checksums path from the defining module; for a module imported as a package member
    # (tests.data.test_datasets) that path lookup needs the missing `importlib_resources` backport. A local
    # builder has no download checksums, so say so.
    code_path = None

    def _info(self):
        features = {
            "image": tfds.features.Tensor(shape=(4, 4, 1), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=3),
        }
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(10), "test": self._generate_examples(4)}

    def _generate_examples(self, n):
        for i in range(n):
            yield i, {"image": np.full((4, 4, 1), i, np.uint8), "label": i % 3}


def test_tfds_adapter_roundtrip(tmp_path):
    TinyImages(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    data = load_tfds("tiny_images", "train", tmp_path)
    assert data["input"].shape == (10, 4, 4, 1) and data["input"].dtype == np.uint8
    assert data["target"].dtype == np.int32
    order = np.argsort(data["input"][:, 0, 0, 0])  # array_record order is not guaranteed to be key order
    np.testing.assert_array_equal(data["input"][order, 0, 0, 0], np.arange(10))
    np.testing.assert_array_equal(data["target"][order], np.arange(10) % 3)
    assert load_tfds("tiny_images", "test", tmp_path)["input"].shape == (4, 4, 4, 1)


def test_tfds_mock_fashion_mnist_and_missing(tmp_path):
    with tfds.testing.mock_data(num_examples=7):
        data = load_fashion_mnist("train", tfds_data_dir=tmp_path)
    assert data["input"].shape == (7, 28, 28, 1) and data["input"].dtype == np.uint8
    assert data["target"].dtype == np.int32 and data["target"].max() < 10
    with pytest.raises(DatasetNotFoundError, match="not prepared"):
        load_tfds("fashion_mnist", "train", tmp_path)


# -- make_loaders --------------------------------------------------------------------------------------------
@needs_fashion
def test_make_loaders_fashion_mnist():
    train, evaluation, info = make_loaders("fashion_mnist", 128, 1000, seed=0)
    assert (info.name, info.num_classes, info.input_shape) == ("fashion_mnist", 10, (28, 28, 1))
    assert (info.num_train, info.num_eval, info.fallback_note) == (60000, 10000, None)
    assert len(train) == 468 and len(evaluation) == 10
    assert not evaluation.shuffle and not evaluation.drop_last


def test_make_loaders_falls_back_to_digits_with_note(tmp_path):
    with pytest.warns(UserWarning, match="using scikit-learn digits instead") as record:
        train, evaluation, info = make_loaders("fashion_mnist", 32, 100, seed=1, data_dir=tmp_path)
    assert info.name == "digits" and info.fallback_note == str(record[0].message)
    assert str(tmp_path) in info.fallback_note and "apt-get install -y dataset-fashion-mnist" in info.fallback_note
    assert (info.num_train, info.num_eval, info.input_shape) == (1347, 450, (8, 8, 1))
    batch = next(iter(train))
    assert batch["input"].shape == (32, 8, 8, 1) and batch["target"].shape == (32,)
    assert sum(len(b["target"]) for b in evaluation) == 450


def test_make_loaders_text_and_unknown():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, evaluation, info = make_loaders("stdlib_text", 4, 8, seed=0, seq_len=32, max_bytes=20_000)
    assert (info.num_classes, info.input_shape, info.num_train) == (256, (32,), (20_000 - 1) // 32)
    batch = next(iter(train))
    assert batch["input_ids"].shape == (4, 33) and batch["input_ids"].dtype == np.int32
    with pytest.raises(ValueError, match="unknown dataset 'cifar'"):
        make_loaders("cifar", 4, 4, seed=0)
