"""Tokenized text corpora (C4 / OpenWebText style): local text files or a prepared TFDS text dataset.

What it is: the GPT pre-training data path. Documents are tokenized once with a Hugging Face ``tokenizers``
tokenizer read from a local ``tokenizer.json``, joined into one flat token stream with the tokenizer's EOS token
after every document (GPT-2's convention, also nanoGPT's OpenWebText preparation), and stored as a flat numpy
file (uint16 when the vocabulary fits, else uint32). Training reads it memory-mapped through ``TokenWindows``:
windows of ``seq_len + 1`` tokens, stride ``seq_len``, so a corpus larger than host memory costs no memory.

The cache lives in ``cache_dir`` (default: next to the data) under a name carrying a hash of everything that
decides its contents: the tokenizer file, the EOS id, every input file's path, size and modification time (or the
TFDS dataset's name, version and size), and ``max_bytes``. Unchanged inputs reuse it; any change writes a new one
and removes the stale one. It is written to a temporary file and renamed, and its ``.json`` description is written
last, so a run killed while tokenizing never leaves a cache that looks complete.

Layout of local files: ``data_dir/train/`` and ``data_dir/val/``, searched recursively, files in sorted order.
A ``*.txt`` file is one document; a ``*.jsonl`` file holds one JSON object per line whose ``"text"`` field is one
document. Bytes that are not UTF-8 are replaced (U+FFFD) rather than failing a long run halfway.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from jaxcomposer.data.tfds_adapter import RECORDS_PER_FETCH, get_many, open_tfds_source
from jaxcomposer.errors import DataError, DatasetNotFoundError

TEXT_EXTENSIONS = (".txt", ".jsonl")
CACHE_DIR_NAME = ".jaxcomposer_tokens"
# Names models' tokenizers give their end-of-text token; used when tokenizer_config.json does not name one.
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")
_ENCODE_BATCH = 512  # documents per encode_batch call: the Rust side parallelizes within a call
_log = logging.getLogger(__name__)


def load_tokenizer(tokenizer_dir: str | os.PathLike, eos_token: str | None = None):
    """``(tokenizer, eos_id)`` from ``tokenizer_dir/tokenizer.json``.

    The EOS token is ``eos_token`` if given, else ``tokenizer_config.json``'s ``eos_token`` when that file is
    there (Hugging Face's own record of it), else the first of ``EOS_CANDIDATES`` in the vocabulary.
    """
    from tokenizers import Tokenizer  # imported when text is tokenized: image-only users never need it

    if tokenizer_dir is None:
        raise DatasetNotFoundError("tokenized text needs tokenizer_dir: a folder with the tokenizer's "
                                   "tokenizer.json (e.g. a Hugging Face model folder such as gpt2's)")
    folder = Path(tokenizer_dir)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise DatasetNotFoundError(f"no tokenizer at {path}; tokenizer_dir must hold the tokenizer's "
                                   f"tokenizer.json (the `tokenizers` format; save_pretrained writes it)")
    tokenizer = Tokenizer.from_file(str(path))
    if eos_token is None and (folder / "tokenizer_config.json").is_file():
        configured = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
        eos_token = configured.get("content") if isinstance(configured, dict) else configured
    names = [eos_token] if eos_token is not None else list(EOS_CANDIDATES)
    for name in names:
        eos_id = tokenizer.token_to_id(name)
        if eos_id is not None:
            return tokenizer, int(eos_id)
    raise DataError(f"the tokenizer in {path} has no end-of-text token (looked for {names}); add eos_token to "
                    f"{folder / 'tokenizer_config.json'}")


def vocab_size(tokenizer) -> int:
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


MASK_CANDIDATES = ("[MASK]", "<mask>")  # BERT's WordPiece, RoBERTa's BPE


def mask_token_id(tokenizer_dir: str | os.PathLike) -> int | None:
    """The tokenizer's mask token (masked-LM training), or None when it has none (GPT-2's)."""
    tokenizer, _ = load_tokenizer(tokenizer_dir)
    ids = [tokenizer.token_to_id(name) for name in MASK_CANDIDATES]
    return next((int(i) for i in ids if i is not None), None)


# -- documents ------------------------------------------------------------------------------------------------
def list_text_files(root: str | os.PathLike) -> list[Path]:
    """``*.txt`` and ``*.jsonl`` under ``root``, recursively, sorted by relative path."""
    root = Path(root)
    if not root.is_dir():
        raise DatasetNotFoundError(f"text folder {root} does not exist; it should hold the split's documents as "
                                   f"*.txt files (one document each) or *.jsonl files (one {{\"text\": ...}} "
                                   f"object per line)")
    files = sorted((p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_EXTENSIONS),
                   key=lambda p: p.relative_to(root).as_posix())
    if not files:
        raise DataError(f"text folder {root} has no *.txt or *.jsonl files")
    return files


def file_documents(files: Iterable[Path]) -> Iterator[str]:
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        if path.suffix.lower() == ".txt":
            yield text
            continue
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                document = record["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{line_no}: expected a JSON object with a \"text\" string field "
                                f"({type(e).__name__}: {e})") from None
            yield document


# -- the cache ------------------------------------------------------------------------------------------------
def _cache_key(parts: dict) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def tokenize_cached(documents: Iterable[str], *, tokenizer, eos_id: int, tokenizer_file: Path, cache_dir: Path,
                    stem: str, inputs: dict, max_bytes: int | None = None) -> np.ndarray:
    """The flat token stream of ``documents`` (each followed by ``eos_id``), memory-mapped from the cache.

    ``inputs`` must describe the documents fully (paths with sizes and mtimes, a dataset's version): it keys the
    cache. ``documents`` is consumed only when the cache must be (re)built. ``max_bytes`` stops after the
    document that brings the UTF-8 text read to at least that many bytes.
    """
    vocab = vocab_size(tokenizer)
    dtype = np.dtype(np.uint16 if vocab <= 2**16 else np.uint32)
    key = _cache_key({"tokenizer_sha256": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest(),
                      "eos_id": eos_id, "dtype": dtype.str, "max_bytes": max_bytes, "inputs": inputs})
    # the source's own tag keeps corpora sharing one cache_dir apart: a rebuild removes only its own stale files
    stem = f"{stem}-{_cache_key({'source': inputs.get('source')})[:8]}"
    data_path, meta_path = cache_dir / f"{stem}-{key}.tokens", cache_dir / f"{stem}-{key}.json"
    if meta_path.is_file() and data_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("num_tokens", -1) * dtype.itemsize == data_path.stat().st_size:
            return np.memmap(data_path, dtype=dtype, mode="r")
    cache_dir.mkdir(parents=True, exist_ok=True)
    _log.info("tokenizing %s into %s (once; later runs reuse it)", inputs.get("source", stem), data_path)
    tmp_path = data_path.with_name(f"{data_path.name}.tmp{os.getpid()}")
    num_tokens = num_documents = num_bytes = 0
    try:
        with open(tmp_path, "wb") as out:
            for chunk in _chunks(documents, max_bytes):
                encodings = tokenizer.encode_batch(chunk, add_special_tokens=False)
                ids = np.concatenate([np.append(np.asarray(e.ids, np.int64), eos_id) for e in encodings])
                out.write(ids.astype(dtype).tobytes())
                num_tokens += len(ids)
                num_documents += len(chunk)
                num_bytes += sum(len(d.encode()) for d in chunk)
        if num_tokens == 0:
            raise DataError(f"no documents to tokenize for {stem} ({inputs.get('source', inputs)})")
    except BaseException:
        tmp_path.unlink(missing_ok=True)  # a bad record or an interrupt leaves no partial file behind
        raise
    os.replace(tmp_path, data_path)
    tmp_meta = meta_path.with_name(f"{meta_path.name}.tmp{os.getpid()}")
    tmp_meta.write_text(json.dumps({"num_tokens": num_tokens, "num_documents": num_documents,
                                    "text_bytes": num_bytes, "dtype": dtype.str, "eos_id": eos_id,
                                    "vocab_size": vocab, "inputs": inputs, "max_bytes": max_bytes}, indent=1))
    os.replace(tmp_meta, meta_path)
    _log.info("tokenized %d documents (%d bytes) into %d tokens: %s", num_documents, num_bytes, num_tokens, data_path)
    for stale in cache_dir.glob(f"{stem}-*"):  # earlier versions of this split's cache
        if stale.name not in (data_path.name, meta_path.name) and stale.suffix in (".tokens", ".json"):
            stale.unlink(missing_ok=True)
    return np.memmap(data_path, dtype=dtype, mode="r")


def _chunks(documents: Iterable[str], max_bytes: int | None) -> Iterator[list[str]]:
    chunk, total = [], 0
    for document in documents:
        if not document:
            continue  # an empty document would only add a lone EOS
        chunk.append(document)
        total += len(document.encode())
        if len(chunk) == _ENCODE_BATCH or (max_bytes is not None and total >= max_bytes):
            yield chunk
            chunk = []
        if max_bytes is not None and total >= max_bytes:
            return
    if chunk:
        yield chunk


# -- the two sources ------------------------------------------------------------------------------------------
def text_file_tokens(data_dir: str | os.PathLike, split: str, tokenizer_dir: str | os.PathLike, *,
                     cache_dir: str | os.PathLike | None = None, max_bytes: int | None = None,
                     eos_token: str | None = None) -> tuple[np.ndarray, int]:
    """``(tokens, vocab_size)`` for ``data_dir/<split>`` (``split`` is 'train' or 'val'); cache default
    ``data_dir/.jaxcomposer_tokens``."""
    if split not in ("train", "val"):
        raise DataError(f"split must be 'train' or 'val', got {split!r}")
    if data_dir is None:
        raise DatasetNotFoundError("text_files needs data_dir: a folder with train/ and val/ sub-folders of "
                                   "*.txt / *.jsonl documents")
    tokenizer, eos_id = load_tokenizer(tokenizer_dir, eos_token)
    root = Path(data_dir) / split
    files = list_text_files(root)
    stat = [(p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    inputs = {"source": str(root.resolve()), "files": stat}
    tokens = tokenize_cached(file_documents(files), tokenizer=tokenizer, eos_id=eos_id,
                             tokenizer_file=Path(tokenizer_dir) / "tokenizer.json",
                             cache_dir=Path(cache_dir) if cache_dir is not None else Path(data_dir) / CACHE_DIR_NAME,
                             stem=split, inputs=inputs, max_bytes=max_bytes)
    return tokens, vocab_size(tokenizer)


def tfds_text_tokens(name: str, split: str, data_dir: str | os.PathLike | None, tokenizer_dir: str | os.PathLike,
                     *, text_key: str = "text", cache_dir: str | os.PathLike | None = None,
                     max_bytes: int | None = None, eos_token: str | None = None) -> tuple[np.ndarray, int]:
    """``(tokens, vocab_size)`` for the ``text_key`` feature of a prepared TFDS dataset's ``split`` (e.g.
    ``c4/en``'s 'train'); cache default: the dataset's own folder (``builder.data_dir``)."""
    tokenizer, eos_id = load_tokenizer(tokenizer_dir, eos_token)
    source, builder = open_tfds_source(name, split, data_dir)
    if text_key not in builder.info.features:
        raise DataError(f"TFDS dataset {name!r} has no feature {text_key!r}; features: "
                        f"{sorted(builder.info.features)}")

    def documents() -> Iterator[str]:
        for start in range(0, len(source), RECORDS_PER_FETCH):
            for record in get_many(source, list(range(start, min(start + RECORDS_PER_FETCH, len(source))))):
                text = record[text_key]
                yield text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)

    inputs = {"source": f"tfds:{builder.info.full_name}", "split": split, "num_examples": len(source)}
    tokens = tokenize_cached(documents(), tokenizer=tokenizer, eos_id=eos_id,
                             tokenizer_file=Path(tokenizer_dir) / "tokenizer.json",
                             cache_dir=Path(cache_dir) if cache_dir is not None else Path(builder.data_dir),
                             stem=f"tokens-{split}", inputs=inputs, max_bytes=max_bytes)
    return tokens, vocab_size(tokenizer)

