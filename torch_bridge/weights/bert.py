"""Hugging Face's BERT layout for :class:`jaxcomposer.models.BERT` (``BertForMaskedLM``,
``BertForSequenceClassification``, and ``BertModel`` for ``head=None``).

==========================================  ===========================================================  =========
NNX                                         Hugging Face (``{p}``: ``bert.``, or nothing for ``BertModel``)  transform
==========================================  ===========================================================  =========
``embeddings.word_embeddings`` (and the     ``{p}embeddings.word_embeddings`` (``position_embeddings``,  copy
position and token-type tables)             ``token_type_embeddings``)
``embeddings.ln``                           ``{p}embeddings.LayerNorm``                                  copy
``layers.{i}.attention.query/key/value``    ``{p}encoder.layer.{i}.attention.self.query/key/value``      transpose
``layers.{i}.attention_output.dense/ln``    ``{p}encoder.layer.{i}.attention.output.dense/LayerNorm``    transpose
``layers.{i}.intermediate.dense``           ``{p}encoder.layer.{i}.intermediate.dense``                  transpose
``layers.{i}.output.dense/ln``              ``{p}encoder.layer.{i}.output.dense/LayerNorm``              transpose
``pooler``                                  ``{p}pooler.dense``                                          transpose
``mlm.transform`` / ``mlm.ln``              ``cls.predictions.transform.dense`` / ``.LayerNorm``         transpose
``mlm.bias``                                ``cls.predictions.bias``                                     copy
(tied to the word embeddings)               ``cls.predictions.decoder.weight``                           alias
(tied to ``mlm.bias``)                      ``cls.predictions.decoder.bias``                             alias
``classifier``                              ``classifier``                                               transpose
==========================================  ===========================================================  =========

Linear weights are transposed ((in, out) <-> (out, in)); biases, LayerNorms and embeddings are copied.
Exports include both tied keys, as ``BertForMaskedLM.state_dict()`` lists them. The ``position_ids`` and
``token_type_ids`` buffers of ``BertEmbeddings`` are non-persistent in transformers 5 (absent from
``state_dict()``); older checkpoints carry them, so they are accepted and skipped on import. A ``head=None`` model
uses ``BertModel``'s keys (no ``bert.`` prefix), so its exports load into ``BertModel`` strictly.
"""
from __future__ import annotations

from torch_bridge.weights.table import ConversionTable, TableBuilder
from jaxcomposer.models.bert import BERT


def hf_bert_table(model: BERT) -> ConversionTable:
    b = TableBuilder("BERT", "hf")
    p = "" if model.head is None else "bert."
    e = f"{p}embeddings"
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        b.embed(("embeddings", name), f"{e}.{name}")
    b.layernorm(("embeddings", "ln"), f"{e}.LayerNorm")
    b.ignore(f"{e}.position_ids")
    b.ignore(f"{e}.token_type_ids")
    for i in range(len(model.layers)):
        h = f"{p}encoder.layer.{i}"
        for name in ("query", "key", "value"):
            b.linear(("layers", i, "attention", name), f"{h}.attention.self.{name}")
        b.linear(("layers", i, "attention_output", "dense"), f"{h}.attention.output.dense")
        b.layernorm(("layers", i, "attention_output", "ln"), f"{h}.attention.output.LayerNorm")
        b.linear(("layers", i, "intermediate", "dense"), f"{h}.intermediate.dense")
        b.linear(("layers", i, "output", "dense"), f"{h}.output.dense")
        b.layernorm(("layers", i, "output", "ln"), f"{h}.output.LayerNorm")
    if model.pooler is not None:
        b.linear(("pooler",), f"{p}pooler.dense")
    if model.mlm is not None:
        b.linear(("mlm", "transform"), "cls.predictions.transform.dense")
        b.layernorm(("mlm", "ln"), "cls.predictions.transform.LayerNorm")
        b.add(("mlm", "bias"), "cls.predictions.bias")
        b.alias("cls.predictions.decoder.weight", f"{e}.word_embeddings.weight")
        b.alias("cls.predictions.decoder.bias", "cls.predictions.bias")
    if model.classifier is not None:
        b.linear(("classifier",), "classifier")
    return b.build(export_aliases=True)
