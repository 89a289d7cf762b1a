"""Hugging Face's GPT-2 layout (``GPT2LMHeadModel``) for :class:`jaxcomposer.models.GPT`.

=====================================  =========================================  =========
NNX                                    Hugging Face                               transform
=====================================  =========================================  =========
``wte`` / ``wpe``                      ``transformer.wte`` / ``transformer.wpe``  copy
``blocks.{i}.ln1`` / ``ln2``           ``transformer.h.{i}.ln_1`` / ``ln_2``      copy
``blocks.{i}.attn.qkv`` / ``proj``     ``transformer.h.{i}.attn.c_attn`` / ``c_proj``  copy
``blocks.{i}.fc`` / ``fc_proj``        ``transformer.h.{i}.mlp.c_fc`` / ``c_proj``     copy
``ln_f``                               ``transformer.ln_f``                       copy
(tied to ``wte``)                      ``lm_head.weight``                         alias
=====================================  =========================================  =========

GPT-2's linear layers are ``Conv1D``, which store weights as (in, out) like ``nnx.Linear``, so nothing is
transposed, and ``c_attn`` packs q, k, v in the same order as ``qkv``. Exports include ``lm_head.weight`` (a copy
of the token embedding), as ``GPT2LMHeadModel.state_dict()`` does. A ``GPT2Model`` state dict (no
``transformer.`` prefix, no head) converts too: :func:`torch_bridge.weights.from_torch_state_dict` tries the
prefix-free keys when the prefixed ones are absent. Older checkpoints' causal-mask buffers
(``attn.bias``, ``attn.masked_bias``) are skipped.
"""
from __future__ import annotations

from torch_bridge.weights.table import ConversionTable, TableBuilder
from jaxcomposer.models.gpt import GPT


def hf_gpt2_table(model: GPT) -> ConversionTable:
    if model.lm_head is not None:
        raise ValueError("torch_bridge.weights: Hugging Face's GPT-2 ties its LM head to the token embedding; "
                         "build the GPT with tie_embeddings=True for the 'hf' layout.")
    b = TableBuilder("GPT", "hf")
    b.embed(("wte",), "transformer.wte")
    b.embed(("wpe",), "transformer.wpe")
    for i in range(len(model.blocks)):
        h = f"transformer.h.{i}"
        b.layernorm(("blocks", i, "ln1"), f"{h}.ln_1")
        b.linear(("blocks", i, "attn", "qkv"), f"{h}.attn.c_attn", transform="copy")
        b.linear(("blocks", i, "attn", "proj"), f"{h}.attn.c_proj", transform="copy")
        b.layernorm(("blocks", i, "ln2"), f"{h}.ln_2")
        b.linear(("blocks", i, "fc"), f"{h}.mlp.c_fc", transform="copy")
        b.linear(("blocks", i, "fc_proj"), f"{h}.mlp.c_proj", transform="copy")
        b.ignore(f"{h}.attn.bias")
        b.ignore(f"{h}.attn.masked_bias")
    b.layernorm(("ln_f",), "transformer.ln_f")
    b.alias("lm_head.weight", "transformer.wte.weight")
    return b.build(export_aliases=True)
