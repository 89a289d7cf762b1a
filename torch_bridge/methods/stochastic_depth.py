"""StochasticDepth's torch surgery (Composer's ``make_resnet_bottleneck_stochastic``): the forward of each
torchvision-layout ``Bottleneck`` (or ``BasicBlock``) is replaced in place, before export; the method card is
:mod:`jaxcomposer.algorithms.stochastic_depth`.

Composer's block-mode forward branches in Python on ``bool(torch.bernoulli(1 - p))``, which torch.export cannot
trace; here both outcomes are computed and ``torch.where`` picks one (same outputs and gradients; the dropped
branch's BatchNorm running statistics still update). ``torch.bernoulli`` and ``torch.rand`` draw from the
forward key in the bridge, so a bridged run replays its drops on resume.
"""
from __future__ import annotations

import types

import torch
from torch import nn

from jaxcomposer.algorithms.stochastic_depth import WARMUP_STATE, layer_drop_rates

__all__ = ["apply_stochastic_depth_torch", "is_target_block", "SURGERY"]

_LAYOUTS = {  # torchvision's class name and the attributes its forward uses
    "ResNetBottleneck": ("Bottleneck", ("conv1", "bn1", "conv2", "bn2", "conv3", "bn3", "relu", "downsample")),
    "ResNetBasicBlock": ("BasicBlock", ("conv1", "bn1", "conv2", "bn2", "relu", "downsample")),
}


def is_target_block(module: nn.Module, target_layer_name: str) -> bool:
    """torchvision's ``Bottleneck`` / ``BasicBlock`` (by class name and layout: torchvision is not required)."""
    name, attrs = _LAYOUTS[target_layer_name]
    return type(module).__name__ == name and all(hasattr(module, a) for a in attrs)


def _branch(self, x: torch.Tensor) -> torch.Tensor:
    out = self.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    if hasattr(self, "conv3"):  # bottleneck: relu, then the 1x1 expansion
        out = self.bn3(self.conv3(self.relu(out)))
    return out


def _drop_rate(self) -> torch.Tensor:
    rate = self.drop_rate
    warm = getattr(self, WARMUP_STATE, None)
    return rate if warm is None else rate * warm


def _block_forward(self, x: torch.Tensor) -> torch.Tensor:
    p = _drop_rate(self).to(x.dtype)
    shortcut = x if self.downsample is None else self.downsample(x)
    out = _branch(self, x)
    if not self.training:
        return torch.relu(out * (1 - p) + shortcut)
    kept = torch.relu(out + shortcut)
    dropped = x if self.downsample is None else torch.relu(shortcut)
    keep = torch.bernoulli(1 - p)  # one draw per block and step
    return torch.where(keep.bool(), kept, dropped)


def _sample_forward(self, x: torch.Tensor) -> torch.Tensor:
    p = _drop_rate(self).to(x.dtype)
    shortcut = x if self.downsample is None else self.downsample(x)
    out = _branch(self, x)
    if self.training:  # Composer's _sample_drop: a 0/1 mask per example, no 1/(1-p) rescaling
        mask = torch.floor((1 - p) + torch.rand([x.shape[0]] + [1] * (x.dim() - 1), dtype=x.dtype, device=x.device))
        out = out * mask
    else:
        out = out * (1 - p)
    return torch.relu(out + shortcut)


def apply_stochastic_depth_torch(model: nn.Module, target_layer_name: str, stochastic_method: str = "block",
                                 drop_rate: float = 0.2, drop_distribution: str = "linear", warmup: bool = False):
    """In place, as Composer: each target block gets ``drop_rate`` (a tensor attribute, as Composer's; a constant in
    the export) and the stochastic forward; ``warmup`` adds a ``drop_warmup_scale`` buffer (model state, set before
    each step by the method's grad wrapper). Blocks are counted in ``model.modules()`` order, Composer's
    ``module_index`` order. ``(model, target blocks)``."""
    blocks = [m for m in model.modules() if m is not model and is_target_block(m, target_layer_name)]
    forward = _block_forward if stochastic_method == "block" else _sample_forward
    for block, rate in zip(blocks, layer_drop_rates(len(blocks), drop_rate, drop_distribution)):
        block.drop_rate = torch.tensor(rate)
        if warmup:
            block.register_buffer(WARMUP_STATE, torch.ones(()))
        elif WARMUP_STATE in block._buffers:
            del block._buffers[WARMUP_STATE]
        block.forward = types.MethodType(forward, block)
    return model, len(blocks)


SURGERY = {"StochasticDepth": apply_stochastic_depth_torch}
