"""A byte-level language-modelling corpus that exists on every machine: the running Python's standard library.

Why: there is no offline natural-text corpus we can rely on (nothing may download at run time), but CPython's
``.py`` sources (~11 MB for 3.11, English comments and docstrings plus code) are always installed. The corpus depends on the
Python version (the device image runs 3.12), so pass ``stdlib_dir`` or build tokens once and carry them when
exact cross-machine equality matters.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import numpy as np

# Byte 0 never occurs in Python source, so it marks document boundaries unambiguously.
FILE_SEPARATOR = b"\x00"
VOCAB_SIZE = 256
# Any path component with one of these names is skipped: third-party code, test suites (huge, repetitive and
# full of deliberately odd bytes), the IDLE app and bytecode caches.
EXCLUDED_DIR_NAMES = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "idlelib", "__pycache__", "turtledemo"}
)
VAL_EVERY = 20  # file k (in sorted order) goes to 'val' when k % VAL_EVERY == VAL_EVERY - 1 (about 5 %)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(stdlib_dir: str | os.PathLike | None = None) -> list[Path]:
    """Sorted (by POSIX relative path) ``.py`` files of the standard library, minus the excluded folders.

    ``_sysconfigdata*`` is skipped too: it records this machine's build paths, not library code.
    """
    root = Path(stdlib_dir) if stdlib_dir is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder {root} does not exist")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIR_NAMES]
        for name in filenames:
            if name.endswith(".py") and not name.startswith("_sysconfigdata"):
                found.append(Path(dirpath, name))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def split_files(files: list[Path], split: str) -> list[Path]:
    """The fixed, documented split: every ``VAL_EVERY``-th file (index % 20 == 19) is 'val', the rest 'train'."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    want_val = split == "val"
    return [f for k, f in enumerate(files) if (k % VAL_EVERY == VAL_EVERY - 1) == want_val]


def load_stdlib_text(
    split: str = "train",
    *,
    max_bytes: int | None = None,
    stdlib_dir: str | os.PathLike | None = None,
) -> np.ndarray:
    """The split's files concatenated, each followed by ``FILE_SEPARATOR``, as a 1-D ``np.uint8`` array.

    ``max_bytes`` truncates the result (and stops reading files early), which keeps tests fast. Nothing is
    cached on disk: reading the sources again is cheap.
    """
    if max_bytes is not None and max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    chunks, total = [], 0
    for path in split_files(stdlib_files(stdlib_dir), split):
        chunk = path.read_bytes() + FILE_SEPARATOR
        chunks.append(chunk)
        total += len(chunk)
        if max_bytes is not None and total >= max_bytes:
            break
    data = b"".join(chunks)[:max_bytes]
    if not data:
        raise ValueError(f"stdlib {split!r} split is empty (no .py files found)")
    return np.frombuffer(data, np.uint8).copy()


class TokenWindows:
    """Non-overlapping windows of ``seq_len + 1`` tokens (stride ``seq_len``) over a 1-D token array, lazily.

    Window ``i`` is ``tokens[i * seq_len : i * seq_len + seq_len + 1]``: inputs are ``w[:-1]``, next-token
    targets ``w[1:]``, and consecutive windows share one token so no target is lost. It is an array-like
    (``shape``, ``dtype``, ``len``, numpy indexing incl. fancy indexing) backed by a zero-copy strided view, so
    ``ArrayLoader({'input_ids': TokenWindows(tokens, 128)}, ...)`` gathers batches without materializing the
    whole (N, seq_len + 1) int32 matrix. Items are returned as ``int32``.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        count = (len(tokens) - 1) // seq_len
        if count <= 0:
            raise ValueError(f"{len(tokens)} tokens are too few for one window of seq_len + 1 = {seq_len + 1}")
        tokens = np.ascontiguousarray(tokens)
        step = tokens.strides[0]
        self._view = np.lib.stride_tricks.as_strided(
            tokens, shape=(count, seq_len + 1), strides=(seq_len * step, step), writeable=False
        )
        self.seq_len = seq_len

    @property
    def shape(self) -> tuple[int, int]:
        return self._view.shape

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self._view.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        return self._view[index].astype(np.int32)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self._view.astype(dtype or np.int32)


def lm_arrays(tokens: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """``{'input_ids': (N, seq_len + 1) int32}`` windows (materialized; see ``TokenWindows`` for the lazy form)."""
    return {"input_ids": np.asarray(TokenWindows(tokens, seq_len))}
