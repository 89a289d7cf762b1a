"""Tokenized text: local *.txt / *.jsonl documents and TFDS text datasets, tokenized once into a cached flat token
file (EOS between documents), read back as TokenWindows."""

import json

import numpy as np
import pytest
import tensorflow_datasets as tfds
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from jaxcomposer.data import dataset_kind, load_tokenizer, make_loaders, text_file_tokens
from jaxcomposer.data import tokens as tokens_mod
from jaxcomposer.errors import DataError, DatasetNotFoundError

EOS = "<|endoftext|>"
TRAIN_DOCS = {
    "a.txt": ["The quick brown fox jumps over the lazy dog.\nSecond line, café."],
    "sub/b.jsonl": ["JSON lines hold one document per line.", "Another document: 12345 tokens?"],
}
VAL_DOCS = {"c.txt": ["Held-out text for validation, quick and brown."]}


def _write_docs(folder, docs):
    for name, texts in docs.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".jsonl"):
            path.write_text("".join(json.dumps({"text": t, "id": k}) + "\n" for k, t in enumerate(texts)) + "\n")
        else:
            path.write_text(texts[0])


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A byte-level BPE (GPT-2's scheme) trained on a few sentences: decoding gives the exact text back."""
    folder = tmp_path_factory.mktemp("tokenizer")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = [t for docs in (TRAIN_DOCS, VAL_DOCS) for texts in docs.values() for t in texts] * 3
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture()
def corpus(tmp_path):
    _write_docs(tmp_path / "corpus" / "train", TRAIN_DOCS)
    _write_docs(tmp_path / "corpus" / "val", VAL_DOCS)
    return tmp_path / "corpus"


def _decode(tokenizer_dir, ids):
    tokenizer, _ = load_tokenizer(tokenizer_dir)
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def test_documents_are_tokenized_with_eos_after_each(corpus, tokenizer_dir):
    tokens, vocab = text_file_tokens(corpus, "train", tokenizer_dir)
    tokenizer, eos_id = load_tokenizer(tokenizer_dir)
    assert vocab == tokenizer.get_vocab_size() and eos_id == tokenizer.token_to_id(EOS) == 0
    assert isinstance(tokens, np.memmap) and tokens.dtype == np.uint16  # vocab 300 fits
    documents = TRAIN_DOCS["a.txt"] + TRAIN_DOCS["sub/b.jsonl"]  # files in sorted order, jsonl lines in order
    assert _decode(tokenizer_dir, tokens) == "".join(d + EOS for d in documents)
    ends = np.flatnonzero(np.asarray(tokens) == eos_id)
    assert len(ends) == 3 and ends[-1] == len(tokens) - 1
    for document, start, end in zip(documents, np.r_[0, ends[:-1] + 1], ends):
        assert _decode(tokenizer_dir, tokens[start:end]) == document
        assert list(tokens[start:end]) == tokenizer.encode(document, add_special_tokens=False).ids


def test_make_loaders_windows_decode_back_to_the_text(corpus, tokenizer_dir):
    train, evals, info = make_loaders("text_files", 2, 4, seed=0, data_dir=corpus, seq_len=5,
                                      tokenizer_dir=tokenizer_dir)
    val_tokens, vocab = text_file_tokens(corpus, "val", tokenizer_dir)
    assert (info.num_classes, info.input_shape, info.num_eval) == (vocab, (5,), (len(val_tokens) - 1) // 5)
    assert dataset_kind("text_files") == "text" and info.mean is None
    windows = np.concatenate([b["input_ids"] for b in evals])
    assert windows.shape == (info.num_eval, 6) and windows.dtype == np.int32
    np.testing.assert_array_equal(windows[:-1, -1], windows[1:, 0])  # consecutive windows share one token
    stream = np.concatenate([windows[:, :-1].ravel(), windows[-1:, -1]])
    np.testing.assert_array_equal(stream, val_tokens[:len(stream)])  # in order, nothing skipped
    assert len(val_tokens) - len(stream) < 5  # only the tail too short for a window is left out
    decoded, whole = _decode(tokenizer_dir, stream), VAL_DOCS["c.txt"][0] + EOS
    assert whole.startswith(decoded) and len(decoded) > len(whole) // 2
    assert len(next(iter(train))["input_ids"]) == 2


def test_cache_is_reused_then_rebuilt_when_a_file_changes(corpus, tokenizer_dir, monkeypatch):
    first, _ = text_file_tokens(corpus, "train", tokenizer_dir)
    cache = corpus / tokens_mod.CACHE_DIR_NAME
    (data_file,) = cache.glob("train-*.tokens")
    stamp = data_file.stat().st_mtime_ns

    def refuse(*args, **kwargs):
        raise AssertionError("the cache was rebuilt although no input changed")

    with monkeypatch.context() as patch:
        patch.setattr(tokens_mod, "_chunks", refuse)
        again, _ = text_file_tokens(corpus, "train", tokenizer_dir)
    np.testing.assert_array_equal(again, first)
    assert data_file.stat().st_mtime_ns == stamp

    (corpus / "train" / "a.txt").write_text("Changed text.")
    changed, _ = text_file_tokens(corpus, "train", tokenizer_dir)
    assert _decode(tokenizer_dir, changed).startswith("Changed text." + EOS)
    assert [p.name for p in cache.glob("train-*.tokens")] != [data_file.name]  # a new key, the stale file removed
    assert len(list(cache.glob("train-*.tokens"))) == len(list(cache.glob("train-*.json"))) == 1
    assert len(list(cache.glob("val-*"))) == 0  # val was never asked for
    other = corpus.parent / "other"
    _write_docs(other / "train", VAL_DOCS)
    text_file_tokens(other, "train", tokenizer_dir, cache_dir=cache)  # a second corpus sharing the cache folder
    assert len(list(cache.glob("train-*.tokens"))) == 2  # neither corpus's cache removes the other's


def test_cache_dir_and_max_bytes(corpus, tokenizer_dir, tmp_path):
    limited, _ = text_file_tokens(corpus, "train", tokenizer_dir, cache_dir=tmp_path / "cache", max_bytes=10)
    assert _decode(tokenizer_dir, limited) == TRAIN_DOCS["a.txt"][0] + EOS  # stops after the first document
    assert len(list((tmp_path / "cache").glob("train-*.tokens"))) == 1
    assert not (corpus / tokens_mod.CACHE_DIR_NAME).exists()
    meta = json.loads(next((tmp_path / "cache").glob("train-*.json")).read_text())
    assert meta["num_documents"] == 1 and meta["num_tokens"] == len(limited)


def test_errors_name_what_to_provide(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "nothing" / "tokenizer.json")):
        load_tokenizer(tmp_path / "nothing")
    with pytest.raises(DatasetNotFoundError, match="tokenizer_dir"):
        make_loaders("text_files", 2, 2, data_dir=corpus)
    with pytest.raises(DatasetNotFoundError, match=str(tmp_path / "absent" / "train")):
        text_file_tokens(tmp_path / "absent", "train", tokenizer_dir)
    with pytest.raises(DataError, match="no end-of-text token"):
        load_tokenizer(tokenizer_dir, eos_token="</s>")
    (corpus / "train" / "sub" / "b.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(DataError, match=r"b\.jsonl:2: expected a JSON object with a \"text\""):
        text_file_tokens(corpus, "train", tokenizer_dir)
    assert [p.name for p in (corpus / tokens_mod.CACHE_DIR_NAME).iterdir()] == []  # no partial cache left


def test_eos_named_by_tokenizer_config(tokenizer_dir, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    tokenizer, _ = load_tokenizer(folder)
    token = tokenizer.id_to_token(7)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": token}}))
    assert load_tokenizer(folder)[1] == 7


# -- TFDS ------------------------------------------------------------------------------------------------------
TFDS_DOCS = {"train": ["first tfds document", "second one, quick fox", "third"], "validation": ["held out lazy dog"]}


class TinyDocs(tfds.core.GeneratorBasedBuilder):
    """A C4-like text dataset ('text' feature, train/validation), built offline."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = None  # see tests/data/test_datasets.py

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(docs) for split, docs in TFDS_DOCS.items()}

    def _generate_examples(self, docs):
        for i, text in enumerate(docs):
            yield i, {"text": text}


def test_tfds_text_tokenized_and_cached_next_to_the_dataset(tmp_path, tokenizer_dir):
    TinyDocs(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
    train, evals, info = make_loaders("tfds_text", 1, 2, data_dir=tmp_path, tfds_name="tiny_docs", seq_len=3,
                                      tokenizer_dir=tokenizer_dir)
    cached = sorted(p.name.split("-")[1] for p in (tmp_path / "tiny_docs" / "1.0.0").glob("tokens-*.tokens"))
    assert cached == ["train", "validation"]
    (train_file,) = (tmp_path / "tiny_docs" / "1.0.0").glob("tokens-train-*.tokens")
    text = _decode(tokenizer_dir, np.fromfile(train_file, np.uint16))
    # array_record order is not key order: every document once, each followed by EOS
    assert sorted(d for d in text.split(EOS) if d) == sorted(TFDS_DOCS["train"]) and text.endswith(EOS)
    assert text.count(EOS) == 3
    (val_file,) = (tmp_path / "tiny_docs" / "1.0.0").glob("tokens-validation-*.tokens")
    np.testing.assert_array_equal(next(iter(evals))["input_ids"][0], np.fromfile(val_file, np.uint16)[:4])
    assert _decode(tokenizer_dir, np.fromfile(val_file, np.uint16)) == TFDS_DOCS["validation"][0] + EOS
    assert info.num_classes == load_tokenizer(tokenizer_dir)[0].get_vocab_size() and info.input_shape == (3,)
    with pytest.raises(DatasetNotFoundError, match="not prepared"):
        make_loaders("tfds_text", 1, 1, data_dir=tmp_path / "empty", tfds_name="tiny_docs",
                     tokenizer_dir=tokenizer_dir)
