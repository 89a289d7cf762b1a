"""Synthetic data for throughput runs: random uint8 images with labels, or random token windows.

What it is: the data half of a "how fast can the step go" benchmark (Composer's ``synthetic`` datasets, the
MLPerf "fake data" runs), with no files to read or decode. Example ``i`` is a pure function of ``(seed, i)``:
generated when its batch is gathered, never held for a whole epoch (an ImageNet-sized nominal epoch of 224 x 224
images would be 193 GB). Shuffling, epochs and exact resume are :class:`IndexedLoader`'s, so a synthetic run
exercises the same loader path as a real one, and the eval set is the same examples every time.

What differs from Composer's ``SyntheticBatchPairDataset``: examples are uint8 images (what our real image loaders
yield; normalize them like ImageNet's) and int32 tokens, not float tensors, and no memory format options.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxcomposer.data.loader import Batch, IndexedLoader, Transform, derive_seed
from jaxcomposer.errors import DataError

_SYNTHETIC_TAG = 3  # loader.py uses 0 and 1, images.py 2


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise DataError(f"{name} must be a positive int, got {value!r}")
    return int(value)


class SyntheticLoader(IndexedLoader):
    """Random examples from per-example generators; ``num_samples`` is the nominal epoch length.

    ``kind='images'``: ``{'input': (B, *shape) uint8, 'target': (B,) int32 in [0, num_classes)}``.
    ``kind='tokens'``: ``{'input_ids': (B, seq_len + 1) int32 in [0, vocab_size)}`` (inputs ``[:-1]``, targets
    ``[1:]``, like ``TokenWindows``). ``data_seed`` picks the examples (train and eval use different ones);
    ``seed`` the order, as for every loader.
    """

    def __init__(self, kind: str, num_samples: int, batch_size: int, *, shape: Sequence[int] = (224, 224, 3),
                 num_classes: int = 1000, seq_len: int = 128, vocab_size: int = 50257, data_seed: int = 0,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, transform: Transform | None = None):
        if kind not in ("images", "tokens"):
            raise DataError(f"kind must be 'images' or 'tokens', got {kind!r}")
        num_samples, batch_size = _positive("num_samples", num_samples), _positive("batch_size", batch_size)
        self.kind = kind
        self.shape = tuple(_positive("shape entry", s) for s in shape)
        self.num_classes = _positive("num_classes", num_classes)
        self.seq_len, self.vocab_size = _positive("seq_len", seq_len), _positive("vocab_size", vocab_size)
        if vocab_size > 2**31:
            raise DataError(f"vocab_size must fit int32, got {vocab_size}")
        self.data_seed = int(data_seed)
        super().__init__(num_samples, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                         transform=transform)

    def example(self, index: int) -> dict[str, np.ndarray]:
        """Example ``index`` alone (what a batch holding it holds in its row)."""
        rng = np.random.default_rng(derive_seed(self.data_seed, index, _SYNTHETIC_TAG))
        if self.kind == "images":
            # rng.bytes is faster than integers(dtype=uint8) and as uniform: this is the host's hot loop.
            pixels = np.frombuffer(rng.bytes(int(np.prod(self.shape))), np.uint8).reshape(self.shape)
            return {"input": pixels, "target": np.int32(rng.integers(self.num_classes))}
        return {"input_ids": rng.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int32)}

    def _gather(self, indices: np.ndarray) -> Batch:
        rows = [self.example(int(i)) for i in indices]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def __repr__(self) -> str:
        what = (f"shape={self.shape}, num_classes={self.num_classes}" if self.kind == "images"
                else f"seq_len={self.seq_len}, vocab_size={self.vocab_size}")
        return (f"SyntheticLoader({self.kind}, {what}, num_samples={self._n}, batch_size={self.batch_size}, "
                f"epoch={self._epoch}, batch_index={self._batch_index})")
