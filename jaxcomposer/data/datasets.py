"""Real image datasets that are available offline: Fashion-MNIST (Debian package) and scikit-learn's digits.

Why these: CI and the benchmark machines have no network, so every dataset here is read from files that a
package installs (docs/design.md, "Data"). Images stay ``uint8`` NHWC to save memory (4x less
than float32, and the gather in ``ArrayLoader`` moves 4x fewer bytes); normalize on device with
``normalize_images`` inside the jitted step. Labels are ``int32`` (JAX's default integer width).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxcomposer.errors import DatasetNotFoundError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_INSTALL_HINT = (
    "install it with `apt-get install -y dataset-fashion-mnist` (Debian/Ubuntu), or pass data_dir= pointing at "
    "a folder with the four IDX .gz files"
)
# Per-pixel statistics of the 60,000 training images scaled to [0, 1] (computed once from the Debian files:
# mean 0.2860405969887955, std 0.35302424451492254).
FASHION_MNIST_MEAN = 0.2860406
FASHION_MNIST_STD = 0.3530242
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dims
_IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dim

# Statistics of the digits images after scaling 0..16 -> 0..255 and then to [0, 1] (whole dataset).
DIGITS_MEAN = 0.3053087
DIGITS_STD = 0.3758859




def normalize_images(x: Any, mean: float | Sequence[float], std: float | Sequence[float]) -> Any:
    """``(x / 255 - mean) / std`` as float32, for uint8 NHWC images; works on numpy and jax arrays alike.

    ``mean``/``std`` are scalars or per-channel sequences. They are reshaped to ``x``'s full rank, so this is
    safe under ``jax_numpy_rank_promotion='raise'``. Call it inside the jitted step so the uint8 batch is what
    crosses host -> device.
    """
    is_numpy = isinstance(x, np.ndarray)
    if is_numpy:
        xp = np
    else:
        import jax.numpy as xp  # deferred: numpy-only users never pay for importing jax here
    shape = (1,) * (x.ndim - 1) + (-1,)
    mean_a = xp.asarray(np.asarray(mean, np.float32).reshape(shape))
    std_a = xp.asarray(np.asarray(std, np.float32).reshape(shape))
    return (x.astype(xp.float32) / xp.float32(255.0) - mean_a) / std_a


# -- Fashion-MNIST -------------------------------------------------------------------------------------------
def _candidate_dirs(data_dir: str | os.PathLike | None) -> list[Path]:
    return [Path(data_dir)] if data_dir is not None else [Path(FASHION_MNIST_DIR)]


def fashion_mnist_available(data_dir: str | os.PathLike | None = None) -> bool:
    """True when all four IDX files exist in ``data_dir`` (default: the Debian package's folder)."""
    names = [f for pair in _FASHION_FILES.values() for f in pair]
    return any(all((d / f).is_file() for f in names) for d in _candidate_dirs(data_dir))


def _read_idx(path: Path, magic: int, tail_shape: tuple[int, ...]) -> np.ndarray:
    """Parse one gzipped IDX file (big-endian int32 header: magic, then one size per dimension)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = len(tail_shape) + 1
    header = 4 * (1 + ndim)
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX file ({len(raw)} bytes)")
    found_magic, *dims = np.frombuffer(raw, ">i4", count=1 + ndim).tolist()
    if found_magic != magic:
        raise ValueError(f"{path}: IDX magic number {found_magic}, expected {magic}; is this the right file?")
    if tuple(dims[1:]) != tail_shape:
        raise ValueError(f"{path}: IDX dims {dims}, expected (N, {', '.join(map(str, tail_shape))})")
    count = int(np.prod(dims))
    if len(raw) - header != count:
        raise ValueError(f"{path}: {len(raw) - header} payload bytes, header promises {count}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def load_fashion_mnist(
    split: str = "train",
    data_dir: str | os.PathLike | None = None,
    *,
    tfds_data_dir: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """Fashion-MNIST as ``{'input': (N, 28, 28, 1) uint8, 'target': (N,) int32}``; 60,000 train / 10,000 test.

    Reads the IDX ``.gz`` files from ``data_dir`` (default ``/usr/share/datasets/fashion-mnist``). With
    ``tfds_data_dir`` it instead reads a prepared TFDS ``fashion_mnist`` (array_record) dataset via ``load_tfds``.
    """
    if split not in _FASHION_FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if tfds_data_dir is not None:
        from jaxcomposer.data.tfds_adapter import load_tfds

        return load_tfds("fashion_mnist", split, tfds_data_dir)
    image_name, label_name = _FASHION_FILES[split]
    tried = []
    for d in _candidate_dirs(data_dir):
        image_path, label_path = d / image_name, d / label_name
        tried += [str(image_path), str(label_path)]
        if image_path.is_file() and label_path.is_file():
            images = _read_idx(image_path, _IDX_IMAGES_MAGIC, (28, 28))
            labels = _read_idx(label_path, _IDX_LABELS_MAGIC, ())
            if len(images) != len(labels):
                raise ValueError(f"{image_path} has {len(images)} images but {label_path} has {len(labels)} labels")
            return {"input": images[..., None].copy(), "target": labels.astype(np.int32)}
    raise DatasetNotFoundError(
        f"Fashion-MNIST {split!r} files not found (tried {', '.join(tried)}); {FASHION_MNIST_INSTALL_HINT}"
    )


# -- scikit-learn digits -------------------------------------------------------------------------------------
def load_digits(split: str = "train", seed: int = 0, test_fraction: float = 0.25) -> dict[str, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits as ``{'input': (N, 8, 8, 1) uint8, 'target': (N,) int32}``.

    The data ship inside scikit-learn (no download); they are read from its data file without importing
    scikit-learn, whose import is slow. The split is stratified (each class keeps its share in both splits, see
    ``stratified_split``) and deterministic for a given ``(seed, test_fraction)``; the default gives 1,347 train /
    450 test. Pixel values 0..16 are scaled to 0..255 (rounded) so the images look like every other uint8 image
    dataset here.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float64)
    x, y = table[:, :-1], table[:, -1].astype(np.int32)
    images = np.rint(x * (255.0 / 16.0)).astype(np.uint8).reshape(-1, 8, 8, 1)
    test = stratified_split(y, test_fraction, seed)
    idx = np.flatnonzero(~test if split == "train" else test)
    return {"input": images[idx], "target": y[idx]}


def _digits_file() -> Path:
    import importlib.util
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz" if spec else None
    if path is None or not path.is_file():
        raise DatasetNotFoundError(f"the digits data ship with scikit-learn, which is not installed (looked for "
                                   f"{path or 'sklearn/datasets/data/digits.csv.gz'}); pip install scikit-learn")
    return path


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> np.ndarray:
    """A boolean test mask over ``labels``: ``ceil(test_fraction * N)`` examples, shared among the classes in
    proportion to their sizes (largest remainders get the leftover places, ties to the smaller class id), each
    class's test examples drawn by a permutation seeded with ``seed``."""
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    n_test = int(np.ceil(test_fraction * len(labels)))
    exact = counts * n_test / len(labels)
    quota = np.floor(exact).astype(int)
    leftover = n_test - quota.sum()
    quota[np.argsort(-(exact - quota), kind="stable")[:leftover]] += 1
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), bool)
    for c, q in zip(classes, quota):
        members = np.flatnonzero(labels == c)
        test[rng.permutation(members)[:q]] = True
    return test
