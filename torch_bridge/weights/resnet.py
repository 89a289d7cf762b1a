"""torchvision's ResNet layout for :class:`jaxcomposer.models.ResNetImageNet` (ResNet-18/34/50/101/152).

=================================  ====================================
NNX                                torchvision
=================================  ====================================
``stem_conv`` / ``stem_bn``        ``conv1`` / ``bn1``
``blocks.{k}.conv1`` ... ``bn3``   ``layer{s+1}.{j}.conv1`` ... ``bn3``
``blocks.{k}.proj_conv`` / ``_bn`` ``layer{s+1}.{j}.downsample.0`` / ``.1``
``head``                           ``fc``
=================================  ====================================

``k`` runs over all blocks; ``(s, j)`` is its stage and index in the stage (``model.stage_of_block``).
"""
from __future__ import annotations

from torch_bridge.weights.table import ConversionTable, TableBuilder
from jaxcomposer.models.resnet_imagenet import ResNetImageNet


def torchvision_table(model: ResNetImageNet) -> ConversionTable:
    b = TableBuilder("ResNetImageNet", "torchvision")
    b.conv(("stem_conv",), "conv1")
    b.batchnorm(("stem_bn",), "bn1")
    n_convs = 2 if model.block_kind == "basic" else 3
    for k, (block, (stage, j)) in enumerate(zip(model.blocks, model.stage_of_block)):
        theirs = f"layer{stage + 1}.{j}"
        for c in range(1, n_convs + 1):
            b.conv(("blocks", k, f"conv{c}"), f"{theirs}.conv{c}")
            b.batchnorm(("blocks", k, f"bn{c}"), f"{theirs}.bn{c}")
        if block.proj_conv is not None:
            b.conv(("blocks", k, "proj_conv"), f"{theirs}.downsample.0")
            b.batchnorm(("blocks", k, "proj_bn"), f"{theirs}.downsample.1")
    b.linear(("head",), "fc")
    return b.build()
