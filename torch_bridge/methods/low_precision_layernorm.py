"""LowPrecisionLayerNorm's torch surgery: ``nn.LayerNorm`` -> :class:`LPLayerNorm`, in place (Composer's policy).

The forward casts the input and the affine parameters to the autocast dtype when autocast is on and runs
``F.layer_norm`` with autocast off, as Composer's. torch.export records it without autocast, so the exported
graph is a plain ``layer_norm``; under the Trainer's ``amp_bf16`` the bridge runs it on bf16 params and
activations (jaxcomposer.algorithms.low_precision_layernorm explains).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torch_bridge.methods.low_precision_norm import norm_in_autocast_dtype, replace_norms_torch, to_low_precision


class LPLayerNorm(nn.LayerNorm):
    """Composer's ``LPLayerNorm``: a LayerNorm computed in the autocast dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_in_autocast_dtype(F.layer_norm, x, self.normalized_shape, self.weight, self.bias, self.eps)


def to_lp_layernorm(layer: nn.Module, module_index: int) -> LPLayerNorm:
    """Composer's ``_to_LPLayerNorm``: same shape and settings, the weights copied."""
    return to_low_precision(layer, nn.LayerNorm, "LowPrecisionLayerNorm", lambda norm, device: LPLayerNorm(
        norm.normalized_shape, norm.eps, norm.elementwise_affine, bias=norm.bias is not None, device=device))


def apply_low_precision_layernorm_torch(model: nn.Module):
    """Every ``nn.LayerNorm`` (not already an LPLayerNorm) becomes an :class:`LPLayerNorm`, in place;
    ``(model, number of them in it)``."""
    return replace_norms_torch(model, nn.LayerNorm, LPLayerNorm, to_lp_layernorm)


SURGERY = {"LowPrecisionLayerNorm": apply_low_precision_layernorm_torch}
