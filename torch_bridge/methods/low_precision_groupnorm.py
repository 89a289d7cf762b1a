"""LowPrecisionGroupNorm's torch surgery: ``nn.GroupNorm`` -> :class:`LPGroupNorm`, in place (Composer's policy).

As LPLayerNorm (torch_bridge.methods.low_precision_layernorm): cast to the autocast dtype while autocast is on,
``F.group_norm`` with autocast off; exported as a plain ``group_norm``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_bridge.methods.low_precision_norm import norm_in_autocast_dtype, replace_norms_torch, to_low_precision


class LPGroupNorm(nn.GroupNorm):
    """Composer's ``LPGroupNorm``: a GroupNorm computed in the autocast dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_in_autocast_dtype(F.group_norm, x, self.num_groups, self.weight, self.bias, self.eps)


def to_lp_groupnorm(layer: nn.Module, module_index: int) -> LPGroupNorm:
    """Composer's ``_to_LPGroupNorm``: same groups, channels, eps and affine, the weights copied."""
    return to_low_precision(layer, nn.GroupNorm, "LowPrecisionGroupNorm", lambda norm, device: LPGroupNorm(
        norm.num_groups, norm.num_channels, norm.eps, norm.affine, device=device))


def apply_low_precision_groupnorm_torch(model: nn.Module):
    """Every ``nn.GroupNorm`` (not already an LPGroupNorm) becomes an :class:`LPGroupNorm`, in place;
    ``(model, number of them in it)``."""
    return replace_norms_torch(model, nn.GroupNorm, LPGroupNorm, to_lp_groupnorm)


SURGERY = {"LowPrecisionGroupNorm": apply_low_precision_groupnorm_torch}
