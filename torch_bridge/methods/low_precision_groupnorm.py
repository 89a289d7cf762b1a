"""LowPrecisionGroupNorm's torch surgery: ``nn.GroupNorm`` -> :class:`LPGroupNorm`, in place (Composer's policy).

As LPLayerNorm (torch_bridge.methods.low_precision_layernorm): cast to the autocast dtype while autocast is on,
``F.group_norm`` with autocast off; exported as a plain ``group_norm``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_bridge.methods.low_precision_layernorm import cast_if_autocast_enabled
from torch_bridge.surgery import copy_affine, count_module_instances, replace_module_classes


class LPGroupNorm(nn.GroupNorm):
    """Composer's ``LPGroupNorm``: a GroupNorm computed in the autocast dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, weight, bias = (cast_if_autocast_enabled(t) for t in (x, self.weight, self.bias))
        with torch.autocast(enabled=False, device_type=x.device.type):
            return F.group_norm(x, self.num_groups, weight, bias, self.eps)


def to_lp_groupnorm(layer: nn.Module, module_index: int) -> LPGroupNorm:
    """Composer's ``_to_LPGroupNorm``: same groups, channels, eps and affine, the weights copied."""
    if not isinstance(layer, nn.GroupNorm):
        raise TypeError(f"LowPrecisionGroupNorm: expected torch.nn.GroupNorm, got {type(layer).__name__}")
    new = LPGroupNorm(layer.num_groups, layer.num_channels, layer.eps, layer.affine,
                      device=layer.weight.device if layer.weight is not None else None)
    return copy_affine(layer, new)


def apply_low_precision_groupnorm_torch(model: nn.Module):
    """Every ``nn.GroupNorm`` (not already an LPGroupNorm) becomes an :class:`LPGroupNorm`, in place;
    ``(model, number of them in it)``."""
    policy = {nn.GroupNorm: lambda m, i: None if isinstance(m, LPGroupNorm) else to_lp_groupnorm(m, i)}
    model, _ = replace_module_classes(model, policy)
    return model, count_module_instances(model, LPGroupNorm)  # of the result: a model converted before does not warn


SURGERY = {"LowPrecisionGroupNorm": apply_low_precision_groupnorm_torch}
