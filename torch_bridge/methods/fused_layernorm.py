"""FusedLayerNorm's torch layer and surgery: ``nn.LayerNorm`` -> :class:`FusedLayerNorm`, in place (Composer's policy,
which swaps in apex's FusedLayerNorm; see :mod:`jaxcomposer.algorithms.fused_layernorm` for the method card).

:class:`FusedLayerNorm` subclasses ``nn.LayerNorm`` (same ``weight``/``bias``, same state-dict keys). Eagerly it is
``F.layer_norm`` (torch's own kernel, already fused on CUDA). While ``torch.export`` traces it emits one op,
``jaxcomposer::fused_layer_norm``, which the lowering registered below turns into the same JAX function the native
NNX replacement runs (:func:`jaxcomposer.algorithms.fused_layernorm.fused_layer_norm`): one-pass statistics and a
hand-written backward, instead of the bridge's plain ``native_layer_norm`` lowering.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from jaxcomposer.algorithms.fused_layernorm import fused_layer_norm
from torch_bridge.ops.registry import lower
from torch_bridge.surgery import copy_affine, count_module_instances, replace_module_classes

__all__ = ["FusedLayerNorm", "apply_fused_layernorm_torch", "from_layer_norm"]


@torch.library.custom_op("jaxcomposer::fused_layer_norm", mutates_args=())
def _fused_layer_norm_op(x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                         normalized_shape: list[int], eps: float) -> torch.Tensor:
    """A LayerNorm over the trailing ``normalized_shape`` axes (for export only: the bridge lowers it)."""
    return F.layer_norm(x, normalized_shape, weight, bias, eps)


@_fused_layer_norm_op.register_fake
def _(x, weight, bias, normalized_shape, eps):
    return torch.empty_like(x)


@lower(torch.ops.jaxcomposer.fused_layer_norm.default)
def _lower_fused_layer_norm(x, weight, bias, normalized_shape, eps):
    # the output in x's dtype, as torch's layer_norm (and the bridge's native_layer_norm) returns it
    return fused_layer_norm(x, weight, bias, eps, n_axes=len(normalized_shape), dtype=x.dtype)


class FusedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` whose exported graph is the fused JAX LayerNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_exporting():
            return _fused_layer_norm_op(x, self.weight, self.bias, list(self.normalized_shape), float(self.eps))
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def from_layer_norm(layer: nn.Module, module_index: int) -> FusedLayerNorm:
    """Composer's ``from_LayerNorm``: same ``normalized_shape`` and ``eps`` (and affine settings), weights copied."""
    if not isinstance(layer, nn.LayerNorm):
        raise TypeError(f"FusedLayerNorm: expected torch.nn.LayerNorm, got {type(layer).__name__}")
    device = layer.weight.device if layer.weight is not None else None
    dtype = layer.weight.dtype if layer.weight is not None else None
    new = FusedLayerNorm(layer.normalized_shape, layer.eps, layer.elementwise_affine, bias=layer.bias is not None,
                         device=device, dtype=dtype)
    new.train(layer.training)
    return copy_affine(layer, new)


def apply_fused_layernorm_torch(model: nn.Module):
    """Every ``nn.LayerNorm`` (not already fused) becomes a :class:`FusedLayerNorm`, in place;
    ``(model, number of fused LayerNorms in it)``."""
    policy = {nn.LayerNorm: lambda m, i: None if isinstance(m, FusedLayerNorm) else from_layer_norm(m, i)}
    model, _ = replace_module_classes(model, policy)
    return model, count_module_instances(model, FusedLayerNorm)  # of the result: a model fused before does not warn


SURGERY = {"FusedLayerNorm": apply_fused_layernorm_torch}
