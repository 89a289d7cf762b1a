"""Torch-level module surgery, run on the ``nn.Module`` before export, so the exported graph already has the change.

``replace_module_classes`` follows Composer's ``composer/utils/module_surgery.py``: policies map a module class to
``(module, module_index) -> replacement | None``; children are visited breadth-first from the root in
``named_children`` order, each distinct module once (a module shared by several parents is replaced in all of
them), ``module_index`` counts the instances of the policy's class seen so far. It edits the module in place, as
Composer's does (``inplace=False`` works on a deep copy instead). Two differences:

- it returns ``(module, replaced)`` rather than ``replaced`` alone, so copy and in-place calls read the same;
- there is no ``optimizers`` argument: the optimizer here is built (``tx.init``) only after the model slot ran, so
  there is nothing to re-point.

``replaced`` maps each module of the *input* model that was replaced to its replacement (with
``recurse_on_replacements``, intermediate replacements appear as keys too, as in Composer).

BlurPool's torch layers (Zhang 2019, Composer's ``blurpool_layers.py``) live here too, so a torch-sourced task can
be surgered before export without the JAX side knowing about them: ``BlurMaxPool2d``, ``BlurConv2d``,
``blur_2d`` and ``apply_blurpool_torch``.
"""
from __future__ import annotations

import collections
import copy
import itertools
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ReplacementFunction", "replace_module_classes", "count_module_instances",
    "default_2d_filter", "blur_2d", "blurmax_pool2d", "BlurMaxPool2d", "BlurConv2d", "apply_blurpool_torch",
]

ReplacementFunction = Callable[[nn.Module, int], Optional[nn.Module]]


# ------------------------------------------------------------------------------------------------ surgery helper
def _add_children_recursive(module: nn.Module, out: "collections.OrderedDict[nn.Module, list]") -> None:
    for name, child in module.named_children():
        if child not in out:
            out[child] = []
            _add_children_recursive(child, out)
        out[child].append((module, name))


def _infer_device(module: nn.Module):
    try:
        return next(itertools.chain(module.parameters(), module.buffers())).device
    except StopIteration:
        return None


def replace_module_classes(module: nn.Module, policies: Mapping[type, ReplacementFunction], *,
                           recurse_on_replacements: bool = False, indices: Optional[dict] = None,
                           inplace: bool = True) -> tuple[nn.Module, dict[nn.Module, nn.Module]]:
    """Composer's ``replace_module_classes``: edits ``module`` in place (or, with ``inplace=False``, a deep copy)
    and returns ``(module or the copy, replaced)``, ``replaced`` mapping each original module to its replacement.

    Policies are tried in the mapping's order; a policy returning ``None`` keeps the module. Weights are not copied
    unless the policy copies them. The root module itself is never replaced (as in Composer), only its descendants.
    """
    if isinstance(module, nn.parallel.DistributedDataParallel):
        raise TypeError("replace_module_classes: do surgery on the underlying module (ddp.module), not on a "
                        "DistributedDataParallel wrapper.")
    memo: dict[int, Any] = {}
    new_module = module if inplace else copy.deepcopy(module, memo)
    copy_to_orig = {id(memo[id(m)]): m for m in module.modules() if id(m) in memo}

    replaced_copies: dict[nn.Module, nn.Module] = {}
    todo: "collections.OrderedDict[nn.Module, list]" = collections.OrderedDict()
    _add_children_recursive(new_module, todo)
    indices = indices if indices is not None else {c: 0 for c in policies}
    for c in policies:
        indices.setdefault(c, 0)
    default_device = _infer_device(new_module)

    while todo:
        child, parents = todo.popitem(last=False)
        for policy_class, fn in policies.items():
            if not isinstance(child, policy_class):
                continue
            replacement = fn(child, indices[policy_class])
            indices[policy_class] += 1
            if replacement is None:
                continue
            assert child not in replaced_copies
            device = _infer_device(child) or default_device
            if device is not None:
                replacement = replacement.to(device)
            replaced_copies[child] = replacement
            for parent, name in parents:
                setattr(parent, name, replacement)
            if recurse_on_replacements:
                todo[replacement] = list(parents)
                _add_children_recursive(replacement, todo)
            # As in Composer, the loop goes on with the next policy on the (now detached) child; a second match
            # would trip the assert above, so policies for overlapping classes should be ordered with care.
    replaced = {copy_to_orig.get(id(old), old): new for old, new in replaced_copies.items()}
    return new_module, replaced


def copy_affine(source: nn.Module, target: nn.Module) -> nn.Module:
    """A norm layer's ``weight`` and ``bias`` (those it has) copied into its replacement; returns ``target``."""
    with torch.no_grad():
        for name in ("weight", "bias"):
            if getattr(source, name, None) is not None:
                getattr(target, name).copy_(getattr(source, name))
    return target


def count_module_instances(module: nn.Module, module_class) -> int:
    """Distinct descendants of ``module`` (not the root) that are instances of ``module_class`` (Composer's)."""
    return len({id(m) for m in module.modules() if m is not module and isinstance(m, module_class)})


# ------------------------------------------------------------------------------------------------ blur layers
def default_2d_filter() -> torch.Tensor:
    """``[1,2,1] ⊗ [1,2,1] / 16`` as a ``(1, 1, 3, 3)`` float32 tensor (sums to 1)."""
    f = torch.tensor([1.0, 2.0, 1.0])
    return (f[:, None] * f[None, :] / 16.0).reshape(1, 1, 3, 3)


def blur_2d(input: torch.Tensor, stride=1, filter: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Composer's ``blur_2d``: depthwise cross-correlation of an NCHW tensor with ``filter`` ('same' zero padding
    of ``k // 2``, then ``stride``). A ``(1, 1, kH, kW)`` filter is repeated over the channels."""
    _, c, h, w = input.shape
    if filter is None:
        filter = default_2d_filter()
    filter = filter.to(dtype=input.dtype, device=input.device)
    if filter.shape[0] == 1 and c > 1:
        filter = filter.repeat(c, 1, 1, 1)
    _, _, fh, fw = filter.shape
    if fh % 2 == 0 or fw % 2 == 0:
        raise IndexError(f"blur_2d: the filter must have odd height and width, got {fh}x{fw}")
    padding = (fh // 2, fw // 2)
    if h + 2 * padding[0] < fh or w + 2 * padding[1] < fw:
        return input
    return F.conv2d(input, filter, stride=stride, padding=padding, groups=c)


def blurmax_pool2d(input: torch.Tensor, kernel_size=None, stride=2, padding=0, dilation=1, ceil_mode=False,
                   filter: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Max over ``kernel_size`` windows with stride 1, then :func:`blur_2d` with the pool's ``stride``."""
    if kernel_size is None:
        kernel_size = (2, 2)
    maxs = F.max_pool2d(input, kernel_size=kernel_size, stride=1, padding=padding, dilation=dilation,
                        ceil_mode=ceil_mode)
    return blur_2d(maxs, stride=stride, filter=filter)


class BlurMaxPool2d(nn.Module):
    """Drop-in for ``nn.MaxPool2d`` with an anti-aliasing blur between the max and the subsampling.

    The filter is a non-persistent buffer (``filt2d``): it follows ``.to()`` but is not in the ``state_dict``, so
    checkpoints of the surgered model have the same keys as before; the bridge holds it as a constant.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode
        self.register_buffer("filt2d", default_2d_filter(), persistent=False)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return blurmax_pool2d(input, kernel_size=self.kernel_size, stride=self.stride, padding=self.padding,
                              dilation=self.dilation, ceil_mode=self.ceil_mode, filter=self.filt2d)

    @staticmethod
    def from_maxpool2d(module: nn.MaxPool2d, module_index: int = -1) -> "BlurMaxPool2d":
        if module.return_indices:
            raise ValueError("BlurMaxPool2d: MaxPool2d(return_indices=True) has no blurred counterpart")
        return BlurMaxPool2d(kernel_size=module.kernel_size, stride=module.stride, padding=module.padding,
                             dilation=module.dilation, ceil_mode=module.ceil_mode)


class BlurConv2d(nn.Module):
    """Drop-in for a strided ``nn.Conv2d`` with an anti-aliasing blur (Composer's ``BlurConv2d``).

    ``blur_first=True``: blur the input with stride 1, then the conv with its own stride (about the same FLOPs as
    the conv alone). ``blur_first=False``: the conv with stride 1, then blur with the conv's stride (the paper's
    order; up to ``stride**2`` times the conv FLOPs). The wrapped conv is ``self.conv`` (so the parameter names gain a
    ``.conv`` segment); the ``(C, 1, 3, 3)`` filter is a non-persistent buffer ``blur_filter``.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=None, padding=0, dilation=1, groups=1,
                 bias=True, blur_first=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        self.blur_first = blur_first
        if blur_first:
            if stride is None:
                raise ValueError("BlurConv2d: blur_first=True needs the conv's stride")
            conv_stride, self.blur_stride, blur_channels = stride, 1, in_channels
        else:
            conv_stride = 1
            self.blur_stride = kernel_size if stride is None else stride
            blur_channels = out_channels
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=conv_stride, padding=padding,
                              dilation=dilation, groups=groups, bias=bias, padding_mode=padding_mode,
                              device=device, dtype=dtype)
        self.register_buffer("blur_filter", default_2d_filter().repeat(blur_channels, 1, 1, 1).to(
            device=device, dtype=dtype or torch.get_default_dtype()), persistent=False)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.blur_first:
            return self.conv(blur_2d(input, stride=self.blur_stride, filter=self.blur_filter))
        return blur_2d(self.conv(input), stride=self.blur_stride, filter=self.blur_filter)

    @staticmethod
    def from_conv2d(module: nn.Conv2d, module_index: int = -1, blur_first: bool = True) -> "BlurConv2d":
        """A BlurConv2d holding a copy of ``module``'s weight and bias."""
        has_bias = module.bias is not None
        new = BlurConv2d(module.in_channels, module.out_channels, module.kernel_size, stride=module.stride,
                         padding=module.padding, dilation=module.dilation, groups=module.groups, bias=has_bias,
                         blur_first=blur_first, padding_mode=module.padding_mode, device=module.weight.device,
                         dtype=module.weight.dtype)
        with torch.no_grad():
            new.conv.weight.copy_(module.weight)
            if has_bias:
                new.conv.bias.copy_(module.bias)
        new.conv.weight.requires_grad_(module.weight.requires_grad)
        return new


def _maybe_replace_strided_conv2d(module: nn.Conv2d, module_index: int, *, blur_first: bool,
                                  min_channels: int) -> Optional[BlurConv2d]:
    if np.max(module.stride) > 1 and module.in_channels >= min_channels:
        return BlurConv2d.from_conv2d(module, module_index, blur_first=blur_first)
    return None


def apply_blurpool_torch(model: nn.Module, replace_convs: bool = True, replace_maxpools: bool = True,
                         blur_first: bool = True, min_channels: int = 16, *, inplace: bool = True
                         ) -> tuple[nn.Module, dict[nn.Module, nn.Module]]:
    """BlurPool surgery on a torch module, in place as Composer's (or on a copy with ``inplace=False``):
    ``(model or the copy, replaced)``.

    ``MaxPool2d`` -> :class:`BlurMaxPool2d`; ``Conv2d`` with a stride > 1 and ``in_channels >= min_channels`` ->
    :class:`BlurConv2d` (weights copied). Exact subclasses count too (``isinstance``, as in Composer).
    """
    policies: dict[type, ReplacementFunction] = {}
    if replace_maxpools:
        policies[nn.MaxPool2d] = BlurMaxPool2d.from_maxpool2d
    if replace_convs:
        policies[nn.Conv2d] = lambda m, i: _maybe_replace_strided_conv2d(m, i, blur_first=blur_first,
                                                                         min_channels=min_channels)
    return replace_module_classes(model, policies, inplace=inplace)
