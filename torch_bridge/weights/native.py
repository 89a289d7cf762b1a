"""Tables for the ``torch_bridge.mirrors`` layouts: module names are the same on both sides.

``MLP``, ``ResNetCIFAR``, ``ConvNet`` and ``GPT`` map onto ``TorchMLP``, ``TorchResNetCIFAR``, ``TorchConvNet`` and
``TorchGPT`` key for key
(``blocks.3.conv1``, ``blocks.0.attn.qkv``, ``head``, ...). A GPT with tied embeddings has no ``lm_head`` on either
side; on import a redundant ``lm_head.weight`` (as nanoGPT-style state dicts carry) is accepted only if it equals
``wte.weight``.
"""
from __future__ import annotations

from torch_bridge.weights.table import ConversionTable, TableBuilder
from jaxcomposer.models.convnet import ConvNet
from jaxcomposer.models.gpt import GPT
from jaxcomposer.models.mlp import MLP
from jaxcomposer.models.resnet import ResNetCIFAR


def mlp_table(model: MLP) -> ConversionTable:
    b = TableBuilder("MLP", "mirror")
    for i in range(len(model.hidden)):
        b.linear(("hidden", i))
    b.linear(("head",))
    return b.build()


def resnet_cifar_table(model: ResNetCIFAR) -> ConversionTable:
    b = TableBuilder("ResNetCIFAR", "mirror")
    b.conv(("stem_conv",))
    b.batchnorm(("stem_bn",))
    for i, block in enumerate(model.blocks):
        for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
            b.conv(("blocks", i, conv))
            b.batchnorm(("blocks", i, bn))
        if block.proj_conv is not None:
            b.conv(("blocks", i, "proj_conv"))
            b.batchnorm(("blocks", i, "proj_bn"))
    b.linear(("head",))
    return b.build()


def convnet_table(model: ConvNet) -> ConversionTable:
    b = TableBuilder("ConvNet", "mirror")
    for i in range(len(model.convs)):
        b.conv(("convs", i))
        b.batchnorm(("bns", i))
    b.linear(("head",))
    return b.build()


def gpt_mirror_table(model: GPT) -> ConversionTable:
    b = TableBuilder("GPT", "mirror")
    b.embed(("wte",))
    b.embed(("wpe",))
    for i in range(len(model.blocks)):
        b.layernorm(("blocks", i, "ln1"))
        b.linear(("blocks", i, "attn", "qkv"))
        b.linear(("blocks", i, "attn", "proj"))
        b.layernorm(("blocks", i, "ln2"))
        b.linear(("blocks", i, "fc"))
        b.linear(("blocks", i, "fc_proj"))
    b.layernorm(("ln_f",))
    if model.lm_head is not None:
        b.linear(("lm_head",), bias=False)
    else:
        b.alias("lm_head.weight", "wte.weight")
    return b.build()
