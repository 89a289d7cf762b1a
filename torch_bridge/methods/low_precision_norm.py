"""What the torch surgeries of LowPrecisionLayerNorm and LowPrecisionGroupNorm share: Composer's cast to the
autocast dtype, the forward that runs the norm with autocast off, the conversion of one layer and the in-place
replacement. It registers no surgery of its own.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from torch_bridge.surgery import copy_affine, count_module_instances, replace_module_classes


def cast_if_autocast_enabled(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """``tensor`` in the autocast dtype of its device while autocast is on (Composer's helper); else as it is."""
    if tensor is None or not torch.is_autocast_enabled(tensor.device.type):
        return tensor
    return tensor.to(dtype=torch.get_autocast_dtype(tensor.device.type))


def norm_in_autocast_dtype(functional_norm: Callable, x: torch.Tensor, shape_or_groups, weight, bias,
                           eps: float) -> torch.Tensor:
    """Composer's low-precision forward: ``functional_norm(x, shape_or_groups, weight, bias, eps)``
    (``F.layer_norm``, ``F.group_norm``) on ``x``, ``weight`` and ``bias`` cast to the autocast dtype, with
    autocast off."""
    x, weight, bias = (cast_if_autocast_enabled(t) for t in (x, weight, bias))
    with torch.autocast(enabled=False, device_type=x.device.type):
        return functional_norm(x, shape_or_groups, weight, bias, eps)


def to_low_precision(layer: nn.Module, norm_type: type, method: str,
                     build: Callable[[nn.Module, torch.device | None], nn.Module]) -> nn.Module:
    """Composer's ``_to_LP*``: ``build(layer, device)`` (the low-precision layer with ``layer``'s settings, on its
    weights' device) with ``layer``'s weights copied; a TypeError naming ``method`` when ``layer`` is not a
    ``norm_type``."""
    if not isinstance(layer, norm_type):
        raise TypeError(f"{method}: expected torch.nn.{norm_type.__name__}, got {type(layer).__name__}")
    return copy_affine(layer, build(layer, layer.weight.device if layer.weight is not None else None))


def replace_norms_torch(model: nn.Module, norm_type: type, lp_type: type,
                        to_lp: Callable[[nn.Module, int], nn.Module]) -> tuple[nn.Module, int]:
    """Every ``norm_type`` module (not already an ``lp_type``) becomes ``to_lp(module, index)``, in place;
    ``(model, number of lp_type modules in it)``."""
    policy = {norm_type: lambda m, i: None if isinstance(m, lp_type) else to_lp(m, i)}
    model, _ = replace_module_classes(model, policy)
    return model, count_module_instances(model, lp_type)  # of the result: a model converted before does not warn
