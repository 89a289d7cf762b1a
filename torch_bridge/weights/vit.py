"""Hugging Face's ViT layouts (``ViTForImageClassification``) for :class:`jaxcomposer.models.ViT`.

``hf`` is transformers 5.x's module tree; ``hf_legacy`` the names of transformers 4.x and of the checkpoints on the
Hub (``google/vit-base-patch16-224``), which transformers 5.x itself renames on load
(``transformers.conversion_mapping``, "ViTModel"). ``V = vit.embeddings``, ``L = vit.layers.{i}`` (legacy:
``vit.encoder.layer.{i}``):

===============================  =================================  ===============================  =========
NNX                              ``hf``                             ``hf_legacy``                    transform
===============================  =================================  ===============================  =========
``patch_embed``                  ``V.patch_embeddings.projection``  (same)                           conv
``cls_token`` (1, 1, D)          ``V.cls_token``                    (same)                           copy
``position_embeddings``          ``V.position_embeddings``          (same)                           copy
``layers.{i}.layernorm_before``  ``L.layernorm_before``             (same)                           copy
``layers.{i}.layernorm_after``   ``L.layernorm_after``              (same)                           copy
``layers.{i}.attention.q_proj``  ``L.attention.q_proj``             ``L.attention.attention.query``  linear
``layers.{i}.attention.k_proj``  ``L.attention.k_proj``             ``L.attention.attention.key``    linear
``layers.{i}.attention.v_proj``  ``L.attention.v_proj``             ``L.attention.attention.value``  linear
``layers.{i}.attention.o_proj``  ``L.attention.o_proj``             ``L.attention.output.dense``     linear
``layers.{i}.fc1``               ``L.mlp.fc1``                      ``L.intermediate.dense``         linear
``layers.{i}.fc2``               ``L.mlp.fc2``                      ``L.output.dense``               linear
``layernorm``                    ``vit.layernorm``                  (same)                           copy
``classifier``                   ``classifier``                     (same)                           linear
===============================  =================================  ===============================  =========

A headless ``ViTModel`` state dict (no ``classifier``, a ``pooler``) does not fit: load it into a ViT by filling
the classifier yourself.
"""
from __future__ import annotations

from torch_bridge.weights.table import ConversionTable, TableBuilder
from jaxcomposer.models.vit import ViT

# our name -> (hf, hf_legacy) within one layer, relative to L
_LAYER_NAMES = {
    ("attention", "q_proj"): ("attention.q_proj", "attention.attention.query"),
    ("attention", "k_proj"): ("attention.k_proj", "attention.attention.key"),
    ("attention", "v_proj"): ("attention.v_proj", "attention.attention.value"),
    ("attention", "o_proj"): ("attention.o_proj", "attention.output.dense"),
    ("fc1",): ("mlp.fc1", "intermediate.dense"),
    ("fc2",): ("mlp.fc2", "output.dense"),
}


def _table(model: ViT, layout: str) -> ConversionTable:
    legacy = layout == "hf_legacy"
    b = TableBuilder("ViT", layout)
    b.conv(("patch_embed",), "vit.embeddings.patch_embeddings.projection", bias=True)
    b.add(("cls_token",), "vit.embeddings.cls_token")
    b.add(("position_embeddings",), "vit.embeddings.position_embeddings")
    for i, layer in enumerate(model.layers):
        theirs = f"vit.encoder.layer.{i}" if legacy else f"vit.layers.{i}"
        b.layernorm(("layers", i, "layernorm_before"), f"{theirs}.layernorm_before")
        for ours, names in _LAYER_NAMES.items():
            linear = layer.attention if ours[0] == "attention" else layer
            bias = getattr(linear, ours[-1]).bias is not None  # q/k/v without bias: HF's qkv_bias=False
            b.linear(("layers", i, *ours), f"{theirs}.{names[legacy]}", bias=bias)
        b.layernorm(("layers", i, "layernorm_after"), f"{theirs}.layernorm_after")
    b.layernorm(("layernorm",), "vit.layernorm")
    b.linear(("classifier",), "classifier")
    return b.build()


def hf_vit_table(model: ViT) -> ConversionTable:
    """transformers 5.x's ``ViTForImageClassification`` keys (``vit.layers.{i}.attention.q_proj``, ...)."""
    return _table(model, "hf")


def hf_vit_legacy_table(model: ViT) -> ConversionTable:
    """transformers 4.x's keys, those of the Hub's ViT checkpoints (``vit.encoder.layer.{i}.attention.attention
    .query``, ...)."""
    return _table(model, "hf_legacy")
